"""The web playground in headless Chromium against `omnistage serve` on zoo models.

Debian's `chromium` driven by Playwright for Python (scripts/test.sh installs the
browser; Playwright's own browser download is never used). Each test opens the page
at `/`, works one tab as a user would and checks what the page shows against the
server. A screenshot of each test's last state lands in test-artifacts/playground/
(ignored by git), whether the test passed or not.

Each model's API test (`omnistage serve` driven by the official clients; test_openai_server_e2e.py
until it moved here) shares its tab's server: a start costs 10-40 s of imports and loading here,
so each model and its arguments start once, and the tests of one model sit together. The API
tests that stop their server come last.
"""

from __future__ import annotations

import base64
import io
import json
import re
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import openai
import psutil
import pytest
import soundfile as sf
from PIL import Image
from remote_server import RemoteServer, finished_video_job

from omnistage.media.video import decode_video

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "playground"
TIMEOUT_MS = 60_000  # the longest a page wait may take on a loaded CI machine
FAST = {"num_inference_steps": 2}
CSM_TALKER_CAP = json.dumps({"0": {"default_sampling_params": {"max_tokens": 160}}})  # see the speech tab's test
# One Qwen2.5-Omni server for its three tests, with a key (the talk tab sends it). A random talker
# rarely emits its end code: cap its codes so the reply stays short, and seed it with a floor on
# its codes, so it never ends at once with no audio (flaky before). The thinker's cap of 6 is for
# the realtime turns, which give none; the chat requests give their own.
OMNI = ("qwen2.5-omni", "--served-model-name", "omni", "--stage-overrides", json.dumps({
    "0": {"default_sampling_params": {"max_tokens": 6}},
    "1": {"default_sampling_params": {"max_tokens": 32, "min_tokens": 8, "seed": 0}}}))


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: pip install -e '.[dev]'")
    if not CHROMIUM.exists():
        pytest.skip(f"no browser at {CHROMIUM}: scripts/test.sh installs Debian's chromium (apt-get, as root)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


SIGNALED = {"z-image"}
"""Its API test stops the server with SIGTERM mid-request: a process of its own. The others serve from a
thread (a process costs a fresh interpreter's imports, several seconds of CPU here)."""


@pytest.fixture(scope="module")
def served(zoo):
    """`served(model, *serve_args, api_key=None)` -> the RemoteServer of that zoo model and those
    arguments: started on first ask, reused while it runs, stopped when another is asked for
    (one server at a time) and at the end of the module."""
    current = {}

    def get(model: str, *args: str, api_key: str | None = None) -> RemoteServer:
        key = (model, args, api_key)
        if key not in current or not current[key].is_running():
            for server in current.values():
                server.__exit__(None, None, None)
            current.clear()
            current[key] = RemoteServer(zoo(model), *args, api_key=api_key, in_process=model not in SIGNALED)
        return current[key]

    yield get
    for server in current.values():
        server.__exit__(None, None, None)


@pytest.fixture
def playground(browser, served, request):
    """`playground(model, *serve_args, **kwargs)` -> (server, page): `omnistage serve` (shared,
    see `served`) and its playground page. After the test the page is screenshotted."""
    started = []

    def start(model, *args: str, **kwargs):
        server = served(model, *args, **kwargs)
        context = browser.new_context(viewport={"width": 960, "height": 640})
        context.set_default_timeout(TIMEOUT_MS)
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        started.append((server, context, page, errors))
        page.goto(server.url + "/")
        return server, page

    yield start
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for server, context, page, errors in started:
        try:
            page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
        finally:
            context.close()
        assert not errors, f"the page raised: {errors}"


def _wav(seconds: float = 0.5, rate: int = 16000) -> bytes:
    """A 220 Hz tone as a 16-bit WAV file."""
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, 0.25 * np.sin(2 * np.pi * 220 * t), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _png(size, color) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def _png_bytes(data_url: str) -> bytes:
    assert data_url.startswith("data:image/png;base64,"), data_url[:40]
    return base64.b64decode(data_url.split(",", 1)[1])


def test_image_tab_generates_and_renders_with_the_api_key(playground):
    server, page = playground("z-image", "--served-model-name", "z-image", api_key="k3y")
    banner = page.locator("#banner")
    banner.wait_for()
    assert "API key" in banner.inner_text()  # 401 from /v1/models, said plainly
    page.fill("#api-key", "k3y")
    page.press("#api-key", "Enter")
    page.locator("#tabbtn-image").wait_for()
    assert page.locator("#tabs button").all_inner_texts() == ["Image", "Chat"]  # image models chat too
    assert page.inner_text("#model-id") == "z-image"
    assert "diffusion" in page.inner_text("#model-stages")
    page.wait_for_function("document.getElementById('queue-depth').textContent === '0'")

    page.fill("#image-prompt", "a red square")
    page.fill("#image-size", "64x48")
    page.fill("#image-steps", "4")
    page.fill("#image-seed", "7")
    page.fill("#image-n", "2")
    with page.expect_request("**/v1/images/generations") as sent:
        page.click("#image-generate")
    assert sent.value.post_data_json["stream"] is True and sent.value.post_data_json["partial_images"] == 2
    page.locator("#image-gallery figure.done").nth(1).wait_for()
    status = page.inner_text("#image-status")
    assert re.fullmatch(r"2 images in [\d.]+ s", status), status  # streamed: no fallback note
    # The first image was previewed from the stream's partial images before it was done.
    assert int(page.get_attribute("#image-gallery figure >> nth=0", "data-partials")) >= 1
    sizes = page.eval_on_selector_all("#image-gallery img", "els => els.map(e => [e.naturalWidth, e.naturalHeight])")
    assert sizes == [[64, 48], [64, 48]]  # decoded and rendered by the browser
    links = page.eval_on_selector_all("#image-gallery a[download]", "els => els.map(e => e.href)")
    assert links[0] == page.get_attribute("#image-gallery img >> nth=0", "src")
    shown = _png_bytes(links[0])

    # The page shows what the API makes for the same request (seeded, so the same pixels).
    answer = server.http().post("/v1/images/generations", json={
        "prompt": "a red square", "size": "64x48", "num_inference_steps": 4, "seed": 7, "n": 2}).json()
    direct = base64.b64decode(answer["data"][0]["b64_json"])
    assert Image.open(io.BytesIO(shown)).tobytes() == Image.open(io.BytesIO(direct)).tobytes()

    # A fresh page keeps the key (local storage). Against a server without image streaming
    # (played here: the first request is refused as such a server refuses it) the page
    # asks again without the two fields and shows the final image.
    asked = []

    def older_server(route):
        asked.append(route.request.post_data_json)
        if len(asked) > 1:
            return route.continue_()
        route.fulfill(status=400, content_type="application/json", body=json.dumps({"error": {
            "message": "unknown extras ['partial_images', 'stream']", "type": "invalid_request_error",
            "param": None, "code": None}}))

    again = page.context.new_page()
    again.route("**/v1/images/generations", older_server)
    again.goto(server.url + "/")
    again.locator("#tabbtn-image").wait_for()
    assert again.locator("#banner").is_hidden()
    for field, value in (("#image-prompt", "a red square"), ("#image-size", "64x48"), ("#image-steps", "4"),
                         ("#image-seed", "7"), ("#image-n", "2")):
        again.fill(field, value)
    again.click("#image-generate")
    again.locator("#image-gallery figure.done").nth(1).wait_for()
    assert [("stream" in body) for body in asked] == [True, False]
    fallback = _png_bytes(again.get_attribute("#image-gallery img >> nth=0", "src"))
    assert Image.open(io.BytesIO(fallback)).tobytes() == Image.open(io.BytesIO(direct)).tobytes()
    assert "no live preview on this server" in again.inner_text("#image-status")


def test_z_image_images_errors_auth_metrics_and_graceful_sigterm(served):
    """Runs after the image tab's test: it stops their server."""
    server = served("z-image", "--served-model-name", "z-image", api_key="k3y")
    try:
        client = server.client()
        assert [m.id for m in client.models.list().data] == ["z-image"]

        result = client.images.generate(model="z-image", prompt="a red square", n=2, size="64x64",
                                        response_format="b64_json", extra_body={**FAST, "seed": 1})
        assert len(result.data) == 2
        assert Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))).size == (64, 64)

        result = client.images.generate(prompt="a blue circle", size="64x32", response_format="url", extra_body=FAST)
        image = httpx.get(result.data[0].url)  # file URLs need no key
        assert image.status_code == 200 and Image.open(io.BytesIO(image.content)).size == (64, 32)

        # Streamed: partial images as the steps go, then the final image, through the SDK unmodified.
        events = list(client.images.generate(prompt="a red square", size="64x64", stream=True, partial_images=2,
                                             extra_body={"num_inference_steps": 6, "seed": 5}))
        assert [e.type for e in events] == ["image_generation.partial_image"] * 2 + ["image_generation.completed"]
        assert [e.partial_image_index for e in events[:2]] == [0, 1] and events[-1].size == "64x64"
        whole = client.images.generate(prompt="a red square", size="64x64",
                                       extra_body={"num_inference_steps": 6, "seed": 5})
        assert events[-1].b64_json == whole.data[0].b64_json  # streaming changes nothing in the result

        http = server.http()
        for body, param in (({"prompt": "x", "size": "64"}, "size"), ({"prompt": "x", "sizes": "64x64"}, "sizes"),
                            ({"prompt": "x", "n": 99}, "n")):
            resp = http.post("/v1/images/generations", json=body)
            assert resp.status_code == 400, resp.text
            error = resp.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
        resp = http.post("/v1/images/generations", json={"prompt": "x", "sizes": "1"})
        assert "sizes" in resp.json()["error"]["message"]  # unknown fields are named
        resp = http.post("/v1/images/generations", content=b"prompt=x", headers={"content-type": "text/plain"})
        assert resp.status_code == 415 and "error" in resp.json()
        with pytest.raises(openai.BadRequestError, match="does not serve"):
            client.chat.completions.create(model="z-image", messages=[{"role": "user", "content": "hi"}],
                                           modalities=["text", "audio"])
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
        assert httpx.post(f"{server.url}/v1/images/generations", json={"prompt": "x"}).status_code == 401

        metrics = httpx.get(f"{server.url}/metrics").text
        assert 'route="/v1/images/generations",status="200"' in metrics
        assert 'omnistage_stage_run_time_seconds_count{pipeline="z_image",stage="diffusion"}' in metrics

        # SIGTERM with a request in flight: it finishes, then everything stops, exit 0.
        children = psutil.Process(server.proc.pid).children(recursive=True)
        answer = {}
        slow = threading.Thread(target=lambda: answer.update(resp=http.post("/v1/images/generations", json={
            "prompt": "slow", "size": "64x64", "num_inference_steps": 12})))
        slow.start()
        deadline = time.time() + 30
        while "omnistage_queue_depth 1.0" not in httpx.get(f"{server.url}/metrics").text and time.time() < deadline:
            time.sleep(0.05)
        assert server.stop(signal.SIGTERM) == 0, server.output()[-3000:]
        slow.join()
        assert answer["resp"].status_code == 200
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    finally:
        server.stop(signal.SIGKILL)


def test_edit_tab_sends_the_images_and_a_drawn_mask(playground):
    _, page = playground("qwen-image-edit", "--served-model-name", "qwen-image-edit")
    page.locator("#tabbtn-edit").wait_for()
    assert page.locator("#tabs button").all_inner_texts() == ["Edit", "Chat"]
    page.fill("#edit-steps", "2")
    page.fill("#edit-size", "32x32")
    red = {"name": "red.png", "mimeType": "image/png", "buffer": _png((32, 32), (200, 30, 30))}
    blue = {"name": "blue.png", "mimeType": "image/png", "buffer": _png((32, 32), (30, 30, 200))}
    # Both images go out (as image[]); this model takes one, and the page says what the server said.
    page.set_input_files("#edit-images", files=[red, blue])
    page.click("#edit-run")
    page.wait_for_function("document.getElementById('edit-status').classList.contains('error')")
    assert "one input image, got 2" in page.inner_text("#edit-status")

    page.set_input_files("#edit-images", files=[red])
    page.wait_for_function("document.getElementById('edit-canvas').width === 32")
    # Paint a stroke down the left quarter of the image: only there may it change.
    box = page.locator("#edit-canvas").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + 2)
    page.mouse.down()
    for i in range(1, 11):
        page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] * i / 10)
    page.mouse.up()
    assert page.inner_text("#edit-mask-note").startswith("mask:")
    page.click("#edit-run")
    page.locator("#edit-gallery figure.done").wait_for()
    result = Image.open(io.BytesIO(_png_bytes(page.get_attribute("#edit-gallery img", "src")))).convert("RGB")
    assert result.size == (32, 32)
    right = {result.getpixel((x, y)) for x in range(16, 32) for y in range(32)}
    assert right == {(200, 30, 30)}  # the mask kept the input where nothing was painted
    stroke = {result.getpixel((6, y)) for y in range(4, 28)}
    assert stroke != {(200, 30, 30)}  # and the edit shows through the painted stroke


def test_qwen_image_edit_serves_edits_only(served):
    server = served("qwen-image-edit", "--served-model-name", "qwen-image-edit")
    client = server.client()
    result = client.images.edit(image=("in.png", _png((32, 32), (200, 30, 30)), "image/png"), prompt="make it blue", n=2, size="32x32",
                                response_format="b64_json", extra_body=FAST)
    assert len(result.data) == 2
    assert Image.open(io.BytesIO(base64.b64decode(result.data[1].b64_json))).size == (32, 32)
    with pytest.raises(openai.BadRequestError, match="/v1/images/edits"):
        client.images.generate(prompt="x", size="32x32")


def test_video_tab_plays_a_job_and_cancels_one(playground):
    server, page = playground("wan-t2v", "--served-model-name", "wan-t2v")
    page.locator("#tabbtn-video").wait_for()
    assert page.locator("#tab-video").is_visible()
    page.fill("#video-size", "32x32")
    page.fill("#video-frames", "5")
    page.fill("#video-fps", "8")
    page.fill("#video-steps", "2")
    page.click("#video-create")
    page.wait_for_function("document.getElementById('video-status').textContent.startsWith('completed')")
    assert page.inner_text("#video-status") == "completed: 5 frames at 8 fps"
    assert page.get_attribute("#video-progress", "value") == "100"
    # The MP4 was fetched with the page's headers and loaded by the browser's player.
    page.wait_for_function("document.getElementById('video-player').readyState >= 1")
    assert page.evaluate("document.getElementById('video-player').duration") > 0

    # A long job (about 6 s here): cancel it once it runs (the header's queue depth, from
    # /metrics, and the job's progress); the server forgets the job and frees its slot.
    page.fill("#video-size", "64x64")
    page.fill("#video-frames", "9")
    page.fill("#video-steps", "300")
    page.click("#video-create")
    page.wait_for_function("document.getElementById('queue-depth').textContent === '1'")
    page.wait_for_function("document.getElementById('video-progress').value > 0")  # live, from the steps
    job_id = page.get_attribute("#video-player", "data-job-id")
    assert re.fullmatch(r"in progress \d+%", page.inner_text("#video-status"))
    page.click("#video-cancel")
    cancelled = time.time()
    page.wait_for_function("document.getElementById('video-status').textContent === 'cancelled'")
    assert page.locator("#video-cancel").is_disabled() and not page.locator("#video-create").is_disabled()
    assert page.get_attribute("#video-progress", "value") == "0"
    assert server.http().get(f"/v1/videos/{job_id}").status_code == 404
    page.wait_for_function("document.getElementById('queue-depth').textContent === '0'")
    assert time.time() - cancelled < 5, "the cancelled job kept its slot"


def test_video_tab_streams_chunks_through_media_source(playground):
    """With "Stream", the tab plays WS /v1/realtime/video's fragmented MP4 through Media Source
    Extensions as the chunks come (Wan sends its video as one chunk at the end)."""
    _, page = playground("wan-t2v", "--served-model-name", "wan-t2v")
    page.locator("#tabbtn-video").wait_for()
    page.check("#video-stream")  # offered: the model serves WS /v1/realtime/video
    for field, value in (("#video-size", "32x32"), ("#video-frames", "9"), ("#video-fps", "8"), ("#video-steps", "2")):
        page.fill(field, value)
    with page.expect_websocket(lambda ws: ws.url.endswith("/v1/realtime/video")):
        page.click("#video-create")
    page.wait_for_function("document.getElementById('video-status').textContent.startsWith('completed')")
    assert page.inner_text("#video-status") == "completed: 1 chunk(s) streamed"
    player = page.locator("#video-player")
    assert player.get_attribute("data-mode") == "mse" and player.get_attribute("data-chunks") == "1"
    # The appended fragment is decoded: 9 frames at 8 fps buffered, the stream ended.
    page.wait_for_function("""(() => { const v = document.getElementById('video-player');
        return v.readyState >= 2 && v.buffered.length && v.buffered.end(0) > 1.0 && isFinite(v.duration); })()""")


def test_wan_t2v_video_job_and_sync(served):
    """Runs after the video tab's test: it stops their server (from its thread: SIGTERM's graceful
    exit is the z-image test's; here the stop proves the deleted job holds nothing up)."""
    server = served("wan-t2v", "--served-model-name", "wan-t2v")
    http = server.http()
    form = {"prompt": "waves", "size": "32x32", "num_frames": "5", "fps": "8", "num_inference_steps": "2"}
    job = finished_video_job(http, http.post("/v1/videos", data=form).json())
    assert job["status"] == "completed", job
    frames, fps = decode_video(http.get(f"/v1/videos/{job['id']}/content").content)
    assert frames.shape[:3] == (5, 32, 32) and fps == 8

    resp = http.post("/v1/videos/sync", data={**form, "seed": "3"})
    assert resp.status_code == 200 and resp.headers["x-num-frames"] == "5"
    assert resp.content[4:8] == b"ftyp"

    resp = http.post("/v1/videos/sync", data={**form, "num_frames": "6"})  # Wan needs 4k+1 frames
    assert resp.status_code == 400 and "num_frames" in resp.json()["error"]["message"]
    assert http.delete(f"/v1/videos/{job['id']}").json()["deleted"] is True

    # A long job's progress moves while it runs, and DELETE stops its compute: the worker is
    # free for the next request long before the job's remaining steps could have run.
    start = time.time()
    job = http.post("/v1/videos", data={**form, "num_inference_steps": "1000"}).json()
    seen = set()
    while job["progress"] < 3 and time.time() - start < 120:
        time.sleep(0.05)
        job = http.get(f"/v1/videos/{job['id']}").json()
        seen.add(job["progress"])
    assert job["status"] == "in_progress" and len(seen) >= 2, job
    seconds_per_step = (time.time() - start) / 30
    http.delete(f"/v1/videos/{job['id']}")
    start = time.time()
    assert http.post("/v1/videos/sync", data=form).status_code == 200
    assert time.time() - start < 900 * seconds_per_step  # the ~970 steps left never ran
    assert server.stop() == 0


def test_speech_tab_plays_while_the_stream_runs(playground):
    # Random weights never say EOS: the talker stops at 160 frames (12.8 s of audio, sent in
    # chunks of 2, then 8). Long enough that the stream outlasts the browser's audio start even
    # when the browser is starved of CPU (at 24 frames played-at-end was 0 in CI; at 64 it was
    # once under a parallel run).
    server, page = playground("csm", "--served-model-name", "csm", "--stage-overrides", CSM_TALKER_CAP)
    page.locator("#tabbtn-speech").wait_for()
    page.wait_for_function("document.getElementById('speech-voice').options.length > 1")
    voices = page.eval_on_selector_all("#speech-voice option", "els => els.map(e => e.value)")
    assert voices == ["", "alloy", "echo", "fable", "onyx", "nova", "shimmer"]

    page.click("#voice-upload-box summary")
    page.fill("#voice-name", "tone")
    page.set_input_files("#voice-file", files=[{"name": "tone.wav", "mimeType": "audio/wav", "buffer": _wav()}])
    page.click("#voice-upload")
    page.wait_for_function("document.getElementById('voice-status').textContent.startsWith('added tone')")
    assert page.input_value("#speech-voice") == "tone"
    assert server.http().get("/v1/audio/voices").json()["data"][-1]["name"] == "tone"

    page.select_option("#speech-voice", "alloy")
    page.fill("#speech-input", "Hello there, this is a longer sentence to read aloud.")
    page.click("#speech-speak")
    status = page.locator("#speech-status")
    page.wait_for_function("document.getElementById('speech-status').dataset.playedAtEndS !== undefined")
    # The browser's reads may merge the server's later chunks (timing), never the first with the rest.
    assert int(status.get_attribute("data-chunks")) >= 2
    # When the last byte arrived the audio clock was already past the first chunk's start.
    assert float(status.get_attribute("data-played-at-end-s")) > 0, status.inner_text()
    assert "streamed" in status.inner_text()
    duration = page.evaluate("""async () => { const a = document.getElementById('speech-audio');
        if (!(a.duration > 0)) await new Promise(r => a.addEventListener('loadedmetadata', r, {once: true}));
        return a.duration; }""")
    assert 12.78 < duration < 12.83  # 160 Mimi frames at 12.5 Hz, replayable as one WAV


def test_csm_speech_whole_streamed_and_sse(served):
    """On the speech tab's server, whose deploy caps the talker at 160 frames (that test checks the
    cap): each request here asks for 8 (random weights never say EOS)."""
    with_8 = {"max_new_tokens": 8}
    server = served("csm", "--served-model-name", "csm", "--stage-overrides", CSM_TALKER_CAP)
    client = server.client()
    wav = client.audio.speech.create(model="csm", voice="alloy", input="Hello there.", response_format="wav",
                                     extra_body=with_8)
    audio, rate = sf.read(io.BytesIO(wav.content))
    assert rate == 24000 and wav.response.headers["x-sample-rate"] == "24000" and len(audio) > 0

    with client.audio.speech.with_streaming_response.create(
            model="csm", voice="alloy", input="Hello there.", response_format="pcm", extra_body=with_8) as resp:
        assert resp.headers["x-sample-rate"] == "24000"
        pcm = np.frombuffer(b"".join(resp.iter_bytes()), dtype="<i2")
    assert len(pcm) == len(audio)  # 8 codec frames either way
    http = server.http()
    with http.stream("POST", "/v1/audio/speech", json={"input": "Hi.", "response_format": "pcm", **with_8,
                                                       "stream_format": "sse"}) as resp:
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    assert sum(len(base64.b64decode(e["audio"])) for e in events if e["type"] == "speech.audio.delta") > 0

    # The talker samples (temperature 0.9): a seed makes it reproducible.
    seeded = [client.audio.speech.create(model="csm", voice="alloy", input="Hi.", response_format="pcm",
                                         extra_body={**with_8, "seed": seed}).content for seed in (5, 5, 6)]
    assert seeded[0] == seeded[1] != seeded[2]
    aac = client.audio.speech.create(model="csm", input="Hi.", voice="alloy", response_format="aac",
                                     extra_body=with_8)
    assert aac.response.headers["content-type"] == "audio/aac" and aac.content[:2] in (b"\xff\xf1", b"\xff\xf9")
    assert events[-1]["usage"]["output_tokens"] == 8 and events[-1]["usage"]["audio_seconds"] > 0
    clip = io.BytesIO()
    sf.write(clip, 0.3 * np.sin(np.arange(16000) / 8.0), 16000, format="WAV")
    ref = "data:audio/wav;base64," + base64.b64encode(clip.getvalue()).decode()
    cloned = client.audio.speech.create(model="csm", voice="alloy", input="Hi.", response_format="pcm",
                                        extra_body={**with_8, "seed": 5, "ref_audio": ref, "ref_text": "A tone."})
    assert len(cloned.content) == len(seeded[0]) and cloned.content != seeded[0]  # the clip changes the voice

    resp = http.post("/v1/audio/speech", json={"input": "Hi.", "voice": "nobody"})
    assert resp.status_code == 400 and "voice" in resp.json()["error"]["message"]
    resp = http.post("/v1/audio/speech", json={"input": "Hi.", "instructions": "whisper"})
    assert resp.status_code == 400 and "instructions" in resp.json()["error"]["message"]


def test_chat_tab_streams_a_reply(playground):
    server, page = playground("qwen2-llm", "--served-model-name", "qwen2-llm")
    page.locator("#tabbtn-chat").wait_for()
    assert page.locator(".audio-only").first.is_hidden()  # a text model: no spoken replies
    page.fill("#chat-input", "Say hello")
    page.fill("#chat-max-tokens", "12")
    page.fill("#chat-temperature", "1")
    page.fill("#chat-seed", "3")
    page.click("#chat-send")
    reply = page.locator(".msg.assistant.done")
    reply.wait_for()
    assert int(reply.get_attribute("data-deltas")) > 1  # drawn piece by piece
    # Seeded sampling: the page shows the tokens the API answers for the same request.
    whole = server.http().post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 12, "temperature": 1, "seed": 3}).json()
    assert reply.locator(".text").text_content() == whole["choices"][0]["message"]["content"]
    assert page.locator(".msg.user").inner_text() == "Say hello"
    assert re.match(r"\d+ pieces in [\d.]+ s", page.inner_text("#chat-status"))


def test_qwen2_llm_chat_plain_and_streamed(zoo, served):
    server = served("qwen2-llm", "--served-model-name", "qwen2-llm")
    client = server.client()
    messages = [{"role": "user", "content": "Say hello"}]
    reply = client.chat.completions.create(model=str(zoo("qwen2-llm")), messages=messages, max_tokens=8,
                                           temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens >= 1 and reply.choices[0].message.role == "assistant"

    stream = client.chat.completions.create(model=str(zoo("qwen2-llm")), messages=messages, max_tokens=8,
                                            temperature=0, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content  # greedy: the same tokens
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")

    resp = server.http().post("/v1/images/generations", json={"prompt": "x"})
    assert resp.status_code == 400 and "/v1/chat/completions" in resp.json()["error"]["message"]


def test_chat_tab_speaks_with_attachments_on_an_omni_model(playground):
    _, page = playground(*OMNI, api_key="k3y")
    page.fill("#api-key", "k3y")
    page.dispatch_event("#api-key", "change")
    page.wait_for_function("document.getElementById('model-id').textContent === 'omni'")
    page.locator("#tabbtn-chat").wait_for()
    assert page.locator("#chat-audio").is_visible()  # text + audio out: spoken replies on offer
    page.check("#chat-audio")
    page.fill("#chat-voice", "Chelsie")
    page.fill("#chat-input", "What is in the picture?")
    page.fill("#chat-max-tokens", "6")
    page.fill("#chat-seed", "1")
    page.set_input_files("#chat-files", files=[
        {"name": "red.png", "mimeType": "image/png", "buffer": _png((32, 32), (200, 30, 30))},
        {"name": "tone.wav", "mimeType": "audio/wav", "buffer": _wav(0.5)}])
    with page.expect_request("**/v1/chat/completions") as sent:
        page.click("#chat-send")
    body = sent.value.post_data_json
    assert [p["type"] for p in body["messages"][0]["content"]] == ["text", "image_url", "input_audio"]
    assert body["modalities"] == ["text", "audio"] and body["audio"] == {"voice": "Chelsie", "format": "pcm16"}
    reply = page.locator(".msg.assistant.done")
    reply.wait_for()
    status = page.locator("#chat-status")
    assert not status.evaluate("e => e.classList.contains('error')"), status.inner_text()
    duration = reply.locator("audio").evaluate("""async a => { if (!(a.duration > 0))
        await new Promise(r => a.addEventListener('loadedmetadata', r, {once: true})); return a.duration; }""")
    assert duration > 0  # the streamed PCM, played as it came and kept as one WAV
    assert page.locator(".msg.user").get_attribute("data-attachments") == "2"


def test_qwen2_5_omni_chat_answers_with_audio(zoo, served):
    model = str(zoo("qwen2.5-omni"))
    server = served(*OMNI, api_key="k3y")
    client = server.client()
    messages = [{"role": "user", "content": "Say hello"}]
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0,
                                           modalities=["text", "audio"], audio={"voice": "Chelsie", "format": "wav"})
    audio = reply.choices[0].message.audio
    wave, rate = sf.read(io.BytesIO(base64.b64decode(audio.data)))
    assert rate == 24000 and len(wave) > 0 and isinstance(audio.transcript, str)

    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0,
                                                 stream=True, modalities=["text", "audio"],
                                                 audio={"voice": "Chelsie", "format": "pcm16"}))
    deltas = [c.choices[0].delta.audio for c in chunks if c.choices and c.choices[0].delta.audio]
    assert sum(len(base64.b64decode(d.data)) for d in deltas if d.data) > 0
    assert "".join(d.transcript or "" for d in deltas) == audio.transcript  # greedy: the same text

    resp = server.http().post("/v1/audio/speech", json={"input": "hi"})
    assert resp.status_code == 400 and "/v1/chat/completions" in resp.json()["error"]["message"]


@contextmanager
def fake_media_page(browser, request, *capture_flags: str):
    """A page of its own browser whose microphone or camera is Chromium's fake capture device
    (`capture_flags` name its file); screenshotted at the end like the others."""
    media = browser.browser_type.launch(executable_path=str(CHROMIUM), args=[
        *CHROMIUM_FLAGS, "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream", *capture_flags,
        "--autoplay-policy=no-user-gesture-required"])
    context = media.new_context(viewport={"width": 960, "height": 640})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield page
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
        context.close()
        media.close()
    assert not errors, f"the page raised: {errors}"


def test_talk_tab_talks_over_the_realtime_route(served, browser, tmp_path, request):
    """The microphone is Chromium's fake capture device playing a WAV of the synthetic voice
    (1 s of voice, 6 s of silence, looped): the server's VAD hears each turn, and the
    answer's audio reaches the page. The API key travels as a WebSocket subprotocol. The
    silence is long so the loop's next "voice" does not barge in on the answer before its
    audio comes (with 1.5 s it did, once, on a loaded machine: a turn cancelled with no audio)."""
    from omnistage.testing.voice import synthetic_speech

    wav = tmp_path / "voice.wav"
    sf.write(wav, np.concatenate([synthetic_speech(1.0, rate=48000), np.zeros(6 * 48000, np.float32)]), 48000,
             subtype="PCM_16")
    server = served(*OMNI, api_key="k3y")
    with fake_media_page(browser, request, f"--use-file-for-fake-audio-capture={wav}") as page:
        # "#talk" asks for the talk tab: whichever model load builds the tabs last shows it.
        _open_with_key(page, server.url + "/#talk")
        page.wait_for_selector("#talk-start", state="visible")
        page.click("#talk-start")
        # The answer's audio reaches the page. On a loaded machine an answer can still outlast the
        # silence and be barged in on by the loop's next voice (cancelled, as it should be): a
        # later turn then speaks, so wait for audio from any turn, not from the first.
        page.wait_for_function("(s => Number(s.dataset.audioBytes || 0) > 0 && Number(s.dataset.turns || 0) >= 1)"
                               "(document.getElementById('talk-status'))", timeout=TIMEOUT_MS * 3)
        status = page.locator("#talk-status")
        assert page.locator("#talk-log .msg.assistant").count() >= 1
        page.click("#talk-stop")
        assert status.inner_text() == "stopped"


def _open_with_key(page, url: str) -> None:
    """Open the omni server's page and type its key: the model (and its tabs) load again with it,
    and the page no longer moves under a click."""
    page.goto(url)
    page.fill("#api-key", "k3y")
    page.dispatch_event("#api-key", "change")
    page.wait_for_function("document.getElementById('model-id').textContent === 'omni'")


def _y4m(path: Path, num_frames: int = 8, width: int = 64, height: int = 48) -> None:
    """A raw YUV 4:2:0 clip (Chromium's fake camera file format): a bar moving across grey."""
    frames = []
    for i in range(num_frames):
        luma = np.full((height, width), 60, np.uint8)
        luma[:, i * width // num_frames:(i + 1) * width // num_frames] = 230
        chroma = np.full((height // 2, width // 2), 128, np.uint8)
        frames.append(b"FRAME\n" + luma.tobytes() + chroma.tobytes() + chroma.tobytes())
    path.write_bytes(f"YUV4MPEG2 W{width} H{height} F4:1 Ip A1:1 C420jpeg\n".encode() + b"".join(frames))


def test_live_tab_sends_the_camera_and_answers_about_it(served, browser, tmp_path, request):
    """The camera is Chromium's fake capture device playing a Y4M clip: the Live tab (shown for a
    model that sees images and answers in text) sends its frames over WS /v1/video/chat/stream,
    and a question is answered about the frames the server took."""
    camera = tmp_path / "camera.y4m"
    _y4m(camera)
    server = served(*OMNI, api_key="k3y")
    with fake_media_page(browser, request, f"--use-file-for-fake-video-capture={camera}") as page:
        _open_with_key(page, server.url + "/#live")
        page.wait_for_selector("#live-start", state="visible")
        page.fill("#live-fps", "5")
        with page.expect_websocket(lambda ws: ws.url.endswith("/v1/video/chat/stream")):
            page.click("#live-start")
        status = page.locator("#live-status")
        page.wait_for_function("Number(document.getElementById('live-status').dataset.framesSent || 0) >= 3")
        page.click("#live-ask")
        page.wait_for_function("Number(document.getElementById('live-status').dataset.answers || 0) >= 1")
        assert not status.evaluate("e => e.classList.contains('error')"), status.inner_text()
        assert int(status.get_attribute("data-frames-consumed") or 0) >= 1  # the question saw camera frames
        answer = page.locator("#live-log .msg.assistant")  # a few tokens: the thinker's cap may cut it
        assert answer.get_attribute("data-status") in ("completed", "incomplete") and answer.inner_text()
        page.click("#live-stop")
        assert status.inner_text() == "stopped"
