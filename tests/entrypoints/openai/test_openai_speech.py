"""Speech over a fake TTS engine (audio chunks at 16 kHz), through the official client."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import openai
import pytest
import soundfile as sf

from omnistage.entrypoints.openai.audio.serving import opus_available

NUM_SAMPLES = 2400  # the fake's three chunks of 800
RATE = 16000


def _client(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


def test_whole_formats(app_client):
    http, engine = app_client("tts")
    client = _client(http)
    wav = client.audio.speech.create(model="fake-tts", voice="alloy", input="hello", response_format="wav")
    audio, rate = sf.read(io.BytesIO(wav.content))
    assert rate == RATE and len(audio) == NUM_SAMPLES
    assert wav.response.headers["x-sample-rate"] == str(RATE)
    assert engine.requests[-1][0] == {"prompt": "hello", "voice": "alloy"}

    flac = client.audio.speech.create(model="fake-tts", voice="alloy", input="hi", response_format="flac", speed=2.0)
    audio, rate = sf.read(io.BytesIO(flac.content))
    assert rate == RATE and len(audio) == NUM_SAMPLES // 2

    mp3 = http.post("/v1/audio/speech", json={"input": "hi"})  # OpenAI's default format
    assert mp3.headers["content-type"] == "audio/mpeg" and len(mp3.content) > 100

    pcm = http.post("/v1/audio/speech", json={"input": "hi", "response_format": "pcm"})
    assert pcm.headers["content-type"] == "audio/pcm" and len(pcm.content) == 2 * NUM_SAMPLES


@pytest.mark.skipif(not opus_available(), reason="PyAV without libopus")
def test_opus(app_client):
    http, _ = app_client("tts")
    resp = http.post("/v1/audio/speech", json={"input": "hi", "response_format": "opus"})
    assert resp.status_code == 200 and resp.headers["x-sample-rate"] == "48000"
    assert resp.content[:4] == b"OggS"


def test_streamed_bytes_with_the_streaming_response(app_client):
    http, engine = app_client("tts", step_delay=0.01)
    client = _client(http)
    with client.audio.speech.with_streaming_response.create(
            model="fake-tts", voice="alloy", input="hello there", response_format="pcm") as resp:
        assert resp.headers["x-sample-rate"] == str(RATE)
        pieces = [piece for piece in resp.iter_bytes() if piece]
    assert len(pieces) >= 3  # one per chunk the model produced
    pcm = np.frombuffer(b"".join(pieces), dtype="<i2")
    assert len(pcm) == NUM_SAMPLES and pcm[0] == int(0.1 * 32767)

    with client.audio.speech.with_streaming_response.create(
            model="fake-tts", voice="alloy", input="hello", response_format="wav") as resp:
        data = resp.read()
    assert data[:4] == b"RIFF" and len(data) == 44 + 2 * NUM_SAMPLES


def test_sse_events(app_client):
    http, _ = app_client("tts")
    with http.stream("POST", "/v1/audio/speech", json={"input": "hi", "response_format": "pcm",
                                                       "stream_format": "sse"}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) == 3 and events[-1]["type"] == "speech.audio.done"
    assert {(e["response_format"], e["sample_rate"], e["channels"]) for e in deltas} == {("pcm", RATE, 1)}
    assert sum(len(base64.b64decode(e["audio"])) for e in deltas) == 2 * NUM_SAMPLES


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": "x", "response_format": "ogg"}, "response_format"),
    ({"input": "x", "ref_text": "hello"}, "ref_text"),
    ({"input": "x", "ref_audio": "bm90IGF1ZGlv"}, "ref_audio"),
    ({"input": "x", "seed": -1}, "seed"),
    ({"input": "x", "speed": 9}, "speed"),
    ({"input": "x", "stream_format": "ws"}, "stream_format"),
    ({"input": "x", "pitch": 2}, "pitch"),  # not a field, nor an extra the model declares
    ({"input": "x", "stream": True}, "response_format"),  # mp3 is encoded once complete
    ({"input": "x", "stream": True, "response_format": "wav", "speed": 2}, "speed"),
    ({"input": "x", "max_new_tokens": 0}, "max_new_tokens"),
])
def test_speech_errors(app_client, body, param):
    http, engine = app_client("tts")
    resp = http.post("/v1/audio/speech", json=body)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param
    assert engine.requests == []


def test_speech_on_a_model_without_audio(app_client):
    http, _ = app_client("image")
    resp = http.post("/v1/audio/speech", json={"input": "x"})
    assert resp.status_code == 400 and "/v1/images/generations" in resp.json()["error"]["message"]


def test_omni_model_speaks_through_chat_not_speech(app_client):
    http, _ = app_client("omni")
    resp = http.post("/v1/audio/speech", json={"input": "x", "response_format": "wav"})
    assert resp.status_code == 400 and "/v1/chat/completions" in resp.json()["error"]["message"]


def test_seed_and_max_new_tokens_reach_the_talker(app_client):
    http, engine = app_client("tts")
    resp = http.post("/v1/audio/speech", json={"input": "hi", "seed": 5, "max_new_tokens": 7, "stream": True,
                                               "response_format": "pcm"})
    assert resp.status_code == 200 and len(resp.content) == 2 * NUM_SAMPLES
    params = engine.raw_params[-1]["talker"]
    assert (params.seed, params.max_tokens) == (5, 7) and params.fields_set == {"seed", "max_tokens"}


def test_batch_items_fail_alone(app_client):
    http, engine = app_client("tts")
    resp = http.post("/v1/audio/speech/batch", json={"voice": "alloy", "items": [
        {"input": "one"}, {"input": ""}, {"input": "three", "response_format": "flac"}]})
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    assert [r["status"] for r in results] == ["success", "error", "success"]
    assert results[1]["error"]["param"] == "items[1].input"
    audio, rate = sf.read(io.BytesIO(base64.b64decode(results[0]["audio_data"])))  # the batch's default: wav
    assert rate == RATE and len(audio) == NUM_SAMPLES and results[2]["media_type"] == "audio/flac"
    assert [prompt for prompt, _, _ in engine.requests] == [{"prompt": "one", "voice": "alloy"},
                                                            {"prompt": "three", "voice": "alloy"}]
    for body, param in (({"items": []}, "items"), ({"items": [{"input": "x"}], "speed": 9}, "speed"),
                        ({"items": [{"input": "x"}], "stream_format": "sse"}, "stream_format"),
                        ({"items": [{"input": "x"}], "pitch": 2}, "pitch")):
        resp = http.post("/v1/audio/speech/batch", json=body)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param
