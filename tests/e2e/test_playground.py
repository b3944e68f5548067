"""The web playground in headless Chromium against `omnistage serve` on zoo models.

Debian's `chromium` driven by Playwright for Python (scripts/test.sh installs the
browser; Playwright's own browser download is never used). Each test opens the page
at `/`, works one tab as a user would and checks what the page shows against the
server. A screenshot of each test's last state lands in test-artifacts/playground/
(ignored by git), whether the test passed or not.
"""

from __future__ import annotations

import base64
import io
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image
from remote_server import RemoteServer

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "playground"
TIMEOUT_MS = 60_000  # the longest a page wait may take on a loaded CI machine


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: pip install -e '.[dev]'")
    if not CHROMIUM.exists():
        pytest.skip(f"no browser at {CHROMIUM}: scripts/test.sh installs Debian's chromium (apt-get, as root)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def playground(browser, request):
    """`playground(model, *serve_args, **kwargs)` -> (server, page): `omnistage serve` and its
    playground page. After the test the page is screenshotted, then the server stopped."""
    started = []

    def start(model, *args: str, **kwargs):
        server = RemoteServer(model, *args, **kwargs)
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
            context.close()
        finally:
            server.__exit__(None, None, None)
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


def test_image_tab_generates_and_renders_with_the_api_key(zoo, playground):
    server, page = playground(zoo("z-image"), "--served-model-name", "z-image", api_key="k3y")
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


def test_edit_tab_sends_the_images_and_a_drawn_mask(zoo, playground):
    _, page = playground(zoo("qwen-image-edit"), "--served-model-name", "qwen-image-edit")
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


def test_video_tab_plays_a_job_and_cancels_one(zoo, playground):
    server, page = playground(zoo("wan-t2v"), "--served-model-name", "wan-t2v")
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


def test_speech_tab_plays_while_the_stream_runs(zoo, playground):
    # Random weights never say EOS: the talker stops at 160 frames (12.8 s of audio, sent in
    # chunks of 2, then 8). Long enough that the stream outlasts the browser's audio start even
    # when the browser is starved of CPU (at 24 frames played-at-end was 0 in CI; at 64 it was
    # once under a parallel run).
    overrides = '{"0": {"default_sampling_params": {"max_tokens": 160}}}'
    server, page = playground(zoo("csm"), "--served-model-name", "csm", "--stage-overrides", overrides)
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


def test_chat_tab_streams_a_reply(zoo, playground):
    model = zoo("qwen2-llm")
    server, page = playground(model, "--served-model-name", "qwen2-llm")
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


def test_chat_tab_speaks_with_attachments_on_an_omni_model(zoo, playground):
    # A random talker rarely emits its end code: cap its codes so the reply stays short, and
    # seed it with a floor on its codes, so it never ends at once with no audio (flaky before).
    talker_cap = '{"1": {"default_sampling_params": {"max_tokens": 32, "min_tokens": 8, "seed": 0}}}'
    _, page = playground(zoo("qwen2.5-omni"), "--served-model-name", "qwen2.5-omni",
                         "--stage-overrides", talker_cap)
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


def test_talk_tab_talks_over_the_realtime_route(zoo, browser, tmp_path, request):
    """The microphone is Chromium's fake capture device playing a WAV of the synthetic voice
    (1 s of voice, 6 s of silence, looped): the server's VAD hears each turn, and the
    answer's audio reaches the page. The API key travels as a WebSocket subprotocol. The
    silence is long so the loop's next "voice" does not barge in on the answer before its
    audio comes (with 1.5 s it did, once, on a loaded machine: a turn cancelled with no audio)."""
    from omnistage.testing.voice import synthetic_speech

    wav = tmp_path / "voice.wav"
    sf.write(wav, np.concatenate([synthetic_speech(1.0, rate=48000), np.zeros(6 * 48000, np.float32)]), 48000,
             subtype="PCM_16")
    talker_cap = '{"0": {"default_sampling_params": {"max_tokens": 6}}, ' \
                 '"1": {"default_sampling_params": {"max_tokens": 32, "min_tokens": 8, "seed": 0}}}'
    mic = browser.browser_type.launch(executable_path=str(CHROMIUM), args=[
        *CHROMIUM_FLAGS, "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}", "--autoplay-policy=no-user-gesture-required"])
    with RemoteServer(zoo("qwen2.5-omni"), "--served-model-name", "omni", "--stage-overrides", talker_cap,
                      api_key="k3y") as server:
        context = mic.new_context(viewport={"width": 960, "height": 640})
        context.set_default_timeout(TIMEOUT_MS)
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(server.url + "/")
            page.fill("#api-key", "k3y")
            page.dispatch_event("#api-key", "change")
            # The model (and its tabs) loaded with the key; the page no longer moves under the click.
            page.wait_for_function("document.getElementById('model-id').textContent === 'omni'")
            page.locator("#tabbtn-talk").click()
            page.click("#talk-start")
            page.wait_for_function("Number(document.getElementById('talk-status').dataset.turns || 0) >= 1",
                                   timeout=TIMEOUT_MS * 2)
            status = page.locator("#talk-status")
            assert int(status.get_attribute("data-audio-bytes") or 0) > 0, status.inner_text()  # the answer's audio
            assert page.locator("#talk-log .msg.assistant").count() >= 1
            page.click("#talk-stop")
            assert status.inner_text() == "stopped"
        finally:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
            context.close()
            mic.close()
    assert not errors, f"the page raised: {errors}"
