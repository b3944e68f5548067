"""The speech API as vLLM-Omni serves it, on the tiny zoo Qwen3-TTS behind a real socket
(uvicorn in a thread of this process, so the test can see the engine): `stream: true` sends
the first audio before the talker's last step, and a client that leaves aborts the engine
request; `max_new_tokens` and the model's extras through the official client's `extra_body`;
`POST /v1/audio/speech/batch` with one bad item."""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from remote_server import free_port  # noqa: E402

FRAMES, SAMPLES_PER_FRAME = 16, 1920  # the deploy's max_tokens here; 12.5 frames/s at 24 kHz
TEXT = "Hello there, how are you?"


class RecordingEngine:
    """AsyncOmni as the server sees it, keeping each request's finished output (its metrics)."""

    def __init__(self, engine):
        self.engine = engine
        self.finished: list = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, *args, **kwargs):
        async for out in self.engine.generate(*args, **kwargs):
            if out.finished:
                self.finished.append(out)
            yield out


@pytest.fixture(scope="module")
def server(zoo):
    from prometheus_client import CollectorRegistry

    from omnistage import AsyncOmni
    from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

    path = str(zoo("qwen3-tts-custom-voice"))
    overrides = {"0": {"default_sampling_params": {"max_tokens": FRAMES, "temperature": 0}}, "*": {"max_num_seqs": 4}}
    registry = CollectorRegistry()
    engine = RecordingEngine(AsyncOmni(path, stage_overrides=overrides, metrics_registry=registry))
    app = create_app(ServerSettings(served_model_name="qwen3-tts", model_path=path), engine, registry)
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.time() + 120
    while not uv.started and thread.is_alive() and time.time() < deadline:
        time.sleep(0.05)
    assert uv.started
    yield f"http://127.0.0.1:{port}", engine, app
    uv.should_exit = True
    thread.join(timeout=60)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def test_stream_sends_audio_before_the_talker_ends(server):
    url, engine, _ = server
    with _client(url).audio.speech.with_streaming_response.create(
            model="qwen3-tts", voice="ryan", input=TEXT, response_format="wav", extra_body={"stream": True}) as resp:
        assert resp.headers["x-sample-rate"] == "24000"
        pieces = resp.iter_bytes()
        first = next(pieces)
        first_time = time.monotonic()
        data = first + b"".join(pieces)
    assert data[:4] == b"RIFF" and len(data) == 44 + 2 * FRAMES * SAMPLES_PER_FRAME
    assert first_time < engine.finished[-1].metrics["stages"]["talker"]["finish_time"]

    for bad, param in (({"response_format": "mp3"}, "response_format"),
                       ({"response_format": "pcm", "speed": 1.5}, "speed")):
        resp = httpx.post(f"{url}/v1/audio/speech", json={"input": TEXT, "stream": True, **bad})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param


def test_a_client_that_leaves_aborts_the_request(server):
    url, engine, app = server
    gateway = app.state.speech_serving.gateway
    body = {"input": TEXT, "response_format": "pcm", "stream": True, "max_new_tokens": 2000}
    with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        pieces = resp.iter_bytes()  # (dropping an unfinished iterator would close the connection)
        assert len(next(pieces)) > 0
        assert gateway.num_admitted == 1 and engine.orchestrator.has_unfinished_requests()
    deadline = time.time() + 10  # 2000 frames take minutes here
    while (gateway.num_admitted or engine.orchestrator.has_unfinished_requests()) and time.time() < deadline:
        time.sleep(0.02)
    assert gateway.num_admitted == 0 and not engine.orchestrator.has_unfinished_requests()
    assert "omnistage_queue_depth 0.0" in httpx.get(f"{url}/metrics").text
    assert all(len(out.audio) < 2000 * SAMPLES_PER_FRAME for out in engine.finished)


def test_max_new_tokens_and_model_extras_through_extra_body(server):
    url, _, _ = server
    client = _client(url)
    speech = client.audio.speech.create(model="qwen3-tts", voice="ryan", input=TEXT, response_format="pcm",
                                        extra_body={"max_new_tokens": 8, "language": "auto"})
    assert len(speech.content) == 2 * 8 * SAMPLES_PER_FRAME  # the deploy's default is 16 frames
    by_id = client.audio.speech.create(model="qwen3-tts", voice={"id": "ryan"}, input=TEXT, response_format="pcm",
                                       extra_body={"max_new_tokens": 8, "language": "auto"})
    assert by_id.content == speech.content  # OpenAI's custom voice object names the same voice
    for voice in ({"id": "nobody"}, {"name": "ryan"}):
        assert httpx.post(f"{url}/v1/audio/speech", json={"input": TEXT, "voice": voice}).json()["error"]["param"] \
            == "voice"
    for extra, param in (({"language": "klingon"}, "language"),  # the model itself refuses it
                         ({"non_streaming_mode": "yes"}, "non_streaming_mode"),
                         ({"pitch": 2}, "pitch"), ({"max_new_tokens": 0}, "max_new_tokens")):
        with pytest.raises(openai.BadRequestError) as e:
            client.audio.speech.create(model="qwen3-tts", voice="ryan", input=TEXT, extra_body=extra)
        assert e.value.body["param"] == param, e.value.body


def test_batch_answers_each_item_with_its_own_status(server):
    url, _, _ = server
    body = {"response_format": "pcm", "max_new_tokens": 4,
            "items": [{"input": "One."}, {"input": "Two.", "voice": "nobody"},
                      {"input": "Three.", "max_new_tokens": 6}]}
    resp = httpx.post(f"{url}/v1/audio/speech/batch", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert (answer["total"], answer["succeeded"], answer["failed"]) == (3, 2, 1)
    first, bad, third = answer["results"]
    assert first["status"] == "success" and first["media_type"] == "audio/pcm" and first["sample_rate"] == 24000
    assert len(base64.b64decode(first["audio_data"])) == 2 * 4 * SAMPLES_PER_FRAME
    assert len(base64.b64decode(third["audio_data"])) == 2 * 6 * SAMPLES_PER_FRAME  # the item's own value wins
    assert bad["status"] == "error" and bad["error"]["param"] == "items[1].voice" and bad["audio_data"] is None

    over = httpx.post(f"{url}/v1/audio/speech/batch", json={"items": [{"input": "x"}] * 33})
    assert over.status_code == 400 and over.json()["error"]["param"] == "items"
    streamed = httpx.post(f"{url}/v1/audio/speech/batch", json={"items": [{"input": "x"}], "stream": True})
    assert streamed.status_code == 400 and json.loads(streamed.text)["error"]["param"] == "stream"
