"""The speech API as vLLM-Omni serves it, on the tiny MOSS-TTS (sampled, seeded per request)
behind a real socket: audio streamed with the official client's streaming response, raw and
as OpenAI's SSE events, equals the whole answer for the same seed; vLLM-Omni's
`extra_params`; `word_timestamps` refused by name on every speech route (no served family
produces alignments); batch items with their own usage."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from remote_server import RemoteServer  # noqa: E402

RATE, SAMPLES_PER_FRAME, WAV_HEADER = 24000, 1920, 44
TEXT = "Hello world! How are you today?"
SEEDED = {"seed": 5, "max_new_tokens": 48}  # seed 5 ends its reply (9 frames) within 48 steps


@pytest.fixture(scope="module")
def server(zoo):
    server = RemoteServer(zoo("moss-tts"), "--served-model-name", "moss-tts", in_process=True)
    yield server
    assert server.stop() == 0


def test_streamed_audio_equals_the_whole_for_the_same_seed(server):
    client = server.client()
    whole = client.audio.speech.create(model="moss-tts", voice="alloy", input=TEXT, response_format="pcm",
                                       extra_body=SEEDED).content
    assert len(whole) == 2 * 9 * SAMPLES_PER_FRAME and np.abs(np.frombuffer(whole, np.int16)).max() > 0
    for fmt, header in (("pcm", 0), ("wav", WAV_HEADER)):
        with client.audio.speech.with_streaming_response.create(
                model="moss-tts", voice="alloy", input=TEXT, response_format=fmt,
                extra_body={"stream": True, **SEEDED}) as resp:
            assert resp.headers["x-sample-rate"] == str(RATE)
            pieces = [p for p in resp.iter_bytes() if p]
        streamed = b"".join(pieces)
        assert len(pieces) >= 2 and streamed[header:] == whole, fmt  # audio left before the talker ended

    with server.http() as http, http.stream("POST", "/v1/audio/speech", json={
            "input": TEXT, "response_format": "pcm", "stream_format": "sse", **SEEDED}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and b"".join(base64.b64decode(e["audio"]) for e in deltas) == whole
    assert deltas[0]["sample_rate"] == RATE and deltas[0]["response_format"] == "pcm"
    done = events[-1]
    assert done["type"] == "speech.audio.done" and done["num_bytes"] == len(whole)
    assert done["usage"]["audio_seconds"] == round(9 * SAMPLES_PER_FRAME / RATE, 3)
    assert done["usage"]["output_tokens"] > 0

    other = client.audio.speech.create(model="moss-tts", voice="alloy", input=TEXT, response_format="pcm",
                                       extra_body={**SEEDED, "seed": 6}).content
    assert other != whole


def test_extra_params_and_word_timestamps(server):
    with server.http() as http:
        def speech(**body):
            return http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm", **SEEDED, **body})

        as_field = speech(language="English")
        assert as_field.status_code == 200, as_field.text
        as_param = speech(extra_params={"language": "English"})
        assert as_param.status_code == 200 and as_param.content == as_field.content
        assert as_field.content != speech().content  # the language is part of the prompt
        for body, param in (({"language": "English", "extra_params": {"language": "Chinese"}}, "language"),
                            ({"extra_params": {"seed": 1}}, "extra_params.seed"),
                            ({"extra_params": {"pitch": 2}}, "pitch"),
                            ({"word_timestamps": True}, "word_timestamps")):
            resp = speech(**body)
            assert resp.status_code == 400 and resp.json()["error"]["param"] == param, (body, resp.text)

        batch = http.post("/v1/audio/speech/batch", json={"response_format": "pcm", **SEEDED, "items": [
            {"input": TEXT}, {"input": TEXT, "word_timestamps": True}]}).json()
        good, bad = batch["results"]
        assert base64.b64decode(good["audio_data"]) == speech().content
        assert good["usage"]["audio_seconds"] == round(9 * SAMPLES_PER_FRAME / RATE, 3)
        assert bad["status"] == "error" and bad["error"]["param"] == "items[1].word_timestamps"
        shared = http.post("/v1/audio/speech/batch", json={"word_timestamps": True, "items": [{"input": TEXT}]})
        assert shared.status_code == 400 and shared.json()["error"]["param"] == "word_timestamps"


def test_websocket_session_refuses_word_timestamps(server):
    from websockets.sync.client import connect

    with connect(server.url.replace("http://", "ws://") + "/v1/audio/speech/stream") as ws:
        ws.send(json.dumps({"type": "session.config", "word_timestamps": True}))
        error = json.loads(ws.recv(timeout=60))
    assert error["type"] == "error" and error["param"] == "word_timestamps"
