"""Speech routes over the real CSM pipeline (tiny zoo checkpoint), in process: every
response format, streaming (raw, WAV, SSE), speed, built-in and registered voices, the
WebSocket session, and the TTFP/RTF metrics."""

from __future__ import annotations

import base64
import io
import json
import struct
import typing

import numpy as np
import pytest
import soundfile as sf
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from omnistage import AsyncOmni
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app
from omnistage.entrypoints.openai.audio.protocol import SpeechFormat
from omnistage.entrypoints.openai.audio.serving import opus_available
from omnistage.models.csm.prompt import BUILTIN_VOICES

FRAMES, SAMPLES_PER_FRAME, RATE = 10, 1920, 24000
NUM_SAMPLES = FRAMES * SAMPLES_PER_FRAME
# Greedy and short: the random tiny model never says EOS, so max_tokens sets the length.
OVERRIDES = {"0": {"default_sampling_params": {"max_tokens": FRAMES, "temperature": 0}}, "*": {"max_num_seqs": 4}}


@pytest.fixture(scope="module")
def http(zoo):
    registry = CollectorRegistry()
    engine = AsyncOmni(zoo("csm"), stage_overrides=OVERRIDES, metrics_registry=registry)
    app = create_app(ServerSettings(served_model_name="csm", model_path=str(zoo("csm"))), engine, registry)
    with TestClient(app) as client:
        yield client


def _wav(seconds: float, rate: int = 16000, channels: int = 2) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    audio = np.stack([0.3 * np.sin(2 * np.pi * 200 * (c + 1) * t) for c in range(channels)], axis=1)
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV")
    return buf.getvalue()


def _speech(http, **body):
    return http.post("/v1/audio/speech", json={"input": "Hello there. How are you?", **body})


@pytest.mark.parametrize("fmt", typing.get_args(SpeechFormat))
def test_every_listed_format(http, fmt):
    if fmt == "opus" and not opus_available():
        pytest.skip("PyAV without libopus")
    resp = _speech(http, response_format=fmt)
    assert resp.status_code == 200, resp.text
    if fmt == "pcm":
        assert resp.headers["x-sample-rate"] == str(RATE) and len(resp.content) == 2 * NUM_SAMPLES
        return
    if fmt == "opus":
        assert resp.headers["x-sample-rate"] == "48000" and resp.content[:4] == b"OggS"
        return
    if fmt == "aac":  # ADTS frames; soundfile reads no AAC, PyAV does
        import av

        with av.open(io.BytesIO(resp.content)) as container:
            frames = [f.to_ndarray() for f in container.decode(audio=0)]
            rate = container.streams.audio[0].rate
        assert resp.headers["content-type"] == "audio/aac" and rate == RATE
        assert abs(sum(f.shape[-1] for f in frames) - NUM_SAMPLES) <= 2048  # AAC pads its frames
        return
    audio, rate = sf.read(io.BytesIO(resp.content))
    assert rate == RATE == int(resp.headers["x-sample-rate"])
    assert abs(len(audio) - NUM_SAMPLES) <= (2304 if fmt == "mp3" else 0)  # mp3 pads its frames


def test_streamed_pcm_and_wav_arrive_in_chunks(http):
    for fmt in ("pcm", "wav"):
        with http.stream("POST", "/v1/audio/speech", json={"input": "Hello there.", "response_format": fmt,
                                                           "stream_format": "audio"}) as resp:
            assert resp.status_code == 200 and resp.headers["x-sample-rate"] == str(RATE)
            pieces = [p for p in resp.iter_bytes() if p]
        data = b"".join(pieces)
        assert len(pieces) >= 2  # 2 frames first, then 8 at a time
        if fmt == "wav":  # a streaming header: sizes unknown (0xFFFFFFFF), PCM16 mono at 24 kHz
            assert data[:4] == b"RIFF" and struct.unpack("<I", data[4:8])[0] == 0xFFFFFFFF
            assert struct.unpack("<I", data[24:28])[0] == RATE and data[36:40] == b"data"
            data = data[44:]
        assert len(data) == 2 * NUM_SAMPLES
    # The first piece is the first chunk's audio: 2 frames (plus the WAV header).
    assert len(pieces[0]) == 44 + 2 * 2 * SAMPLES_PER_FRAME


def test_sse_events(http):
    resp = _speech(http, response_format="pcm", stream_format="sse")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and events[-1]["type"] == "speech.audio.done"
    assert sum(len(base64.b64decode(e["audio"])) for e in deltas) == 2 * NUM_SAMPLES
    usage = events[-1]["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] == FRAMES
    assert usage["total_tokens"] == usage["input_tokens"] + FRAMES
    assert usage["input_characters"] == len("Hello there. How are you?")
    assert usage["audio_seconds"] == NUM_SAMPLES / RATE


def test_inline_reference_audio_clones_like_a_registered_voice(http):
    ref = base64.b64encode(_wav(1.0)).decode()
    inline = _speech(http, response_format="pcm", ref_audio=ref, ref_text="This is my voice.")
    assert inline.status_code == 200, inline.text
    assert inline.content != _speech(http, response_format="pcm").content
    data_url = _speech(http, response_format="pcm", ref_audio="data:audio/wav;base64," + ref,
                       ref_text="This is my voice.")
    assert data_url.content == inline.content
    over_voice = _speech(http, response_format="pcm", voice="nova", ref_audio=ref, ref_text="This is my voice.")
    assert over_voice.content == inline.content  # the clip overrides the voice
    http.post("/v1/audio/voices", data={"name": "same", "ref_text": "This is my voice."},
              files={"audio_sample": ("ref.wav", _wav(1.0), "audio/wav")})
    try:
        assert _speech(http, response_format="pcm", voice="same").content == inline.content
    finally:
        http.delete("/v1/audio/voices/same")
    for body, param in (({"ref_audio": base64.b64encode(_wav(0.01)).decode()}, "ref_audio"),
                        ({"ref_audio": "@@@"}, "ref_audio")):
        resp = _speech(http, **body)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text


def test_speed_and_builtin_voices(http):
    fast = _speech(http, response_format="wav", speed=2.0)
    audio, _ = sf.read(io.BytesIO(fast.content))
    assert len(audio) == NUM_SAMPLES // 2
    default = _speech(http, response_format="pcm").content
    assert _speech(http, response_format="pcm", voice="alloy").content == default  # alloy is the default
    assert _speech(http, response_format="pcm", voice="nova").content != default  # another speaker id
    resp = _speech(http, voice="nobody")
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "voice"
    assert "nova" in resp.json()["error"]["message"]
    resp = _speech(http, instructions="whisper")
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "instructions"


def test_voices_register_use_list_delete(http):
    listed = http.get("/v1/audio/voices").json()["data"]
    assert [v["name"] for v in listed] == list(BUILTIN_VOICES) and listed[0]["type"] == "builtin"

    # A stereo 16 kHz clip: mixed to mono, and resampled to 24 kHz by the model.
    resp = http.post("/v1/audio/voices", data={"name": "my-voice", "ref_text": "This is my voice."},
                     files={"audio_sample": ("ref.wav", _wav(1.0), "audio/wav")})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {**resp.json(), "name": "my-voice", "type": "cloned", "sample_rate": 16000,
                           "duration_s": 1.0, "ref_text": "This is my voice."}
    assert [v["name"] for v in http.get("/v1/audio/voices").json()["data"]][-1] == "my-voice"

    cloned = _speech(http, response_format="pcm", voice="my-voice")
    assert cloned.status_code == 200 and len(cloned.content) == 2 * NUM_SAMPLES
    assert cloned.content != _speech(http, response_format="pcm").content  # the context turn changes the speech

    again = http.post("/v1/audio/voices", data={"name": "my-voice"},
                      files={"audio_sample": ("ref.wav", _wav(1.0), "audio/wav")})
    assert again.status_code == 409 and again.json()["error"]["code"] == "voice_exists"
    assert http.delete("/v1/audio/voices/my-voice").json() == {"name": "my-voice", "object": "voice",
                                                               "deleted": True}
    assert http.delete("/v1/audio/voices/my-voice").status_code == 404
    assert http.delete("/v1/audio/voices/alloy").status_code == 400
    assert _speech(http, voice="my-voice").status_code == 400


def _multipart(fields: dict) -> tuple[bytes, str]:
    """A multipart body with text fields only (httpx sends multipart only with a file)."""
    body = b"".join(f'--b\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
                    for k, v in fields.items())
    return body + b"--b--\r\n", "multipart/form-data; boundary=b"


@pytest.mark.parametrize("data, sample, param", [
    ({"name": "v"}, b"not audio at all", "audio_sample"),
    ({"name": "v"}, b"", "audio_sample"),
    ({"name": "v"}, _wav(0.01), "audio_sample"),  # too short
    ({"name": "v"}, _wav(61, rate=8000, channels=1), "audio_sample"),  # too long
    ({"name": "v"}, None, "audio_sample"),  # missing
    ({"name": "bad name!"}, _wav(1.0), "name"),
    ({"name": "alloy"}, _wav(1.0), "name"),
    ({"name": "v", "consent": "yes"}, _wav(1.0), "consent"),
])
def test_bad_voice_uploads_are_400(http, data, sample, param):
    if sample is None:
        body, content_type = _multipart(data)
        resp = http.post("/v1/audio/voices", content=body, headers={"content-type": content_type})
    else:
        resp = http.post("/v1/audio/voices", data=data, files={"audio_sample": ("x.wav", sample, "audio/wav")})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
    assert "v" not in [v["name"] for v in http.get("/v1/audio/voices").json()["data"]]


def test_websocket_session(http):
    with http.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "session.config", "voice": "nova", "response_format": "pcm"})
        ws.send_text("this is not json")
        ws.send_json({"type": "input.text", "text": "Hello there. How"})
        ws.send_json({"type": "bogus"})
        ws.send_json({"type": "session.config", "voice": "echo"})  # too late: text has started
        ws.send_json({"type": "input.text", "text": " are you? Fine"})
        ws.send_json({"type": "input.done"})
        events, audio = [], {}
        while True:
            message = ws.receive()
            if message.get("bytes") is not None:
                audio[events[-1]["sentence_index"]] += message["bytes"]
                continue
            event = json.loads(message["text"])
            events.append(event)
            if event["type"] == "audio.start":
                audio[event["sentence_index"]] = b""
            if event["type"] == "session.done":
                break
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 3 and "JSON" in errors[0]["message"] and "session.config" in errors[2]["message"]
    starts = [e for e in events if e["type"] == "audio.start"]
    assert [e["sentence_text"] for e in starts] == ["Hello there.", "How are you?", "Fine"]
    assert all(e["sample_rate"] == RATE and e["format"] == "pcm" for e in starts)
    dones = [e for e in events if e["type"] == "audio.done"]
    assert [d["sentence_index"] for d in dones] == [0, 1, 2] and all(d["error"] is None for d in dones)
    assert all(d["total_bytes"] == len(audio[d["sentence_index"]]) == 2 * NUM_SAMPLES for d in dones)
    assert events[-1] == {"type": "session.done", "total_sentences": 3}
    # The session's voice was used: the first sentence is a plain request's with voice nova
    # (up to float rounding: the session's sentences ran as one batch).
    alone = _speech(http, input="Hello there.", voice="nova", response_format="pcm").content
    diff = np.frombuffer(audio[0], "<i2").astype(int) - np.frombuffer(alone, "<i2")
    assert np.abs(diff).max() <= 4


def test_websocket_bad_voice_is_an_error_event(http):
    with http.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "session.config", "voice": "nobody"})
        error = ws.receive_json()
        assert error["type"] == "error" and error["param"] == "voice"
        ws.send_json({"type": "input.text", "text": "Hi."})
        ws.send_json({"type": "input.done"})
        kinds = []
        while not kinds or kinds[-1] != "session.done":
            message = ws.receive()
            if message.get("text"):
                kinds.append(json.loads(message["text"])["type"])
    assert kinds == ["audio.start", "audio.done", "session.done"]


def test_audio_metrics_on_metrics_endpoint(http):
    _speech(http, response_format="pcm")
    text = http.get("/metrics").text
    assert 'omnistage_request_time_to_first_audio_seconds_count{pipeline="csm"}' in text
    assert 'omnistage_request_real_time_factor_count{pipeline="csm"}' in text
