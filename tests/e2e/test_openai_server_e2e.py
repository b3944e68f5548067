"""`omnistage serve` in a real process with zoo models, driven by the official clients.

One server per model (a start costs ~10-20 s of imports and loading here).
"""

from __future__ import annotations

import base64
import io
import json
import signal
import threading
import time

import httpx
import openai
import psutil
import pytest
from PIL import Image
from remote_server import RemoteServer, finished_video_job

from omnistage.media.video import decode_video

pytestmark = pytest.mark.e2e

FAST = {"num_inference_steps": 2}


def _png(size=(32, 32)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


def test_z_image_images_errors_auth_metrics_and_graceful_sigterm(zoo):
    server = RemoteServer(zoo("z-image"), "--served-model-name", "z-image", api_key="k3y")
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


def test_qwen_image_edit_serves_edits_only(zoo):
    with RemoteServer(zoo("qwen-image-edit")) as server:
        client = server.client()
        result = client.images.edit(image=("in.png", _png(), "image/png"), prompt="make it blue", n=2, size="32x32",
                                    response_format="b64_json", extra_body=FAST)
        assert len(result.data) == 2
        assert Image.open(io.BytesIO(base64.b64decode(result.data[1].b64_json))).size == (32, 32)
        with pytest.raises(openai.BadRequestError, match="/v1/images/edits"):
            client.images.generate(prompt="x", size="32x32")


def test_qwen2_llm_chat_plain_and_streamed(zoo):
    with RemoteServer(zoo("qwen2-llm")) as server:
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


def test_wan_t2v_video_job_and_sync(zoo):
    with RemoteServer(zoo("wan-t2v")) as server:
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
        assert server.stop(signal.SIGTERM) == 0


def test_qwen2_5_omni_chat_answers_with_audio(zoo):
    import soundfile as sf

    model = str(zoo("qwen2.5-omni"))
    # A random talker rarely emits its end code: cap its codes so the test stays short; and, unseeded,
    # it may emit it first (no audio): a floor and a seed keep every answer audible.
    talker_cap = json.dumps({"1": {"default_sampling_params": {"max_tokens": 32, "min_tokens": 8, "seed": 0}}})
    with RemoteServer(model, "--stage-overrides", talker_cap) as server:
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


def test_csm_speech_whole_streamed_and_sse(zoo):
    import json

    import numpy as np
    import soundfile as sf

    # Random weights never say EOS: cap the talker through the deploy layer.
    overrides = '{"0": {"default_sampling_params": {"max_tokens": 8}}}'
    with RemoteServer(zoo("csm"), "--served-model-name", "csm", "--stage-overrides", overrides) as server:
        client = server.client()
        wav = client.audio.speech.create(model="csm", voice="alloy", input="Hello there.", response_format="wav")
        audio, rate = sf.read(io.BytesIO(wav.content))
        assert rate == 24000 and wav.response.headers["x-sample-rate"] == "24000" and len(audio) > 0

        with client.audio.speech.with_streaming_response.create(
                model="csm", voice="alloy", input="Hello there.", response_format="pcm") as resp:
            assert resp.headers["x-sample-rate"] == "24000"
            pcm = np.frombuffer(b"".join(resp.iter_bytes()), dtype="<i2")
        assert len(pcm) == len(audio)  # 8 codec frames either way
        http = server.http()
        with http.stream("POST", "/v1/audio/speech", json={"input": "Hi.", "response_format": "pcm",
                                                           "stream_format": "sse"}) as resp:
            events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1]["type"] == "speech.audio.done"
        assert sum(len(base64.b64decode(e["audio"])) for e in events if e["type"] == "speech.audio.delta") > 0

        # The talker samples (temperature 0.9): a seed makes it reproducible.
        seeded = [client.audio.speech.create(model="csm", voice="alloy", input="Hi.", response_format="pcm",
                                             extra_body={"seed": seed}).content for seed in (5, 5, 6)]
        assert seeded[0] == seeded[1] != seeded[2]
        aac = client.audio.speech.create(model="csm", input="Hi.", voice="alloy", response_format="aac")
        assert aac.response.headers["content-type"] == "audio/aac" and aac.content[:2] in (b"\xff\xf1", b"\xff\xf9")
        assert events[-1]["usage"]["output_tokens"] == 8 and events[-1]["usage"]["audio_seconds"] > 0
        clip = io.BytesIO()
        sf.write(clip, 0.3 * np.sin(np.arange(16000) / 8.0), 16000, format="WAV")
        ref = "data:audio/wav;base64," + base64.b64encode(clip.getvalue()).decode()
        cloned = client.audio.speech.create(model="csm", voice="alloy", input="Hi.", response_format="pcm",
                                            extra_body={"seed": 5, "ref_audio": ref, "ref_text": "A tone."})
        assert len(cloned.content) == len(seeded[0]) and cloned.content != seeded[0]  # the clip changes the voice

        resp = http.post("/v1/audio/speech", json={"input": "Hi.", "voice": "nobody"})
        assert resp.status_code == 400 and "voice" in resp.json()["error"]["message"]
        resp = http.post("/v1/audio/speech", json={"input": "Hi.", "instructions": "whisper"})
        assert resp.status_code == 400 and "instructions" in resp.json()["error"]["message"]
