"""Speech route over the real Fish Speech pipeline (tiny zoo checkpoint), in process: the audio,
whole and streamed, the seed, and 400s naming the field (the model has no voices to describe
and cannot clone without the codec's encoder)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile as sf
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from omnistage import AsyncOmni
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

RATE, SAMPLES_PER_FRAME = 44100, 2048
TEXT = "Hello world! How are you today?"
SEEDED = {"seed": 1, "max_new_tokens": 6}


@pytest.fixture(scope="module")
def http(zoo):
    registry = CollectorRegistry()
    path = str(zoo("fish-speech"))
    engine = AsyncOmni(path, stage_overrides={"*": {"max_num_seqs": 2}}, metrics_registry=registry)
    app = create_app(ServerSettings(served_model_name="fish-speech", model_path=path), engine, registry)
    with TestClient(app) as client:
        yield client


def _speech(http, **body):
    return http.post("/v1/audio/speech", json={"input": TEXT, "voice": "alloy", **SEEDED, **body})


def test_speech_whole_and_streamed(http):
    wav = _speech(http, response_format="wav")
    assert wav.status_code == 200, wav.text
    audio, rate = sf.read(io.BytesIO(wav.content), dtype="int16")
    assert rate == RATE and len(audio) == 6 * SAMPLES_PER_FRAME and np.abs(audio).max() > 0

    with http.stream("POST", "/v1/audio/speech", json={"input": TEXT, "voice": "alloy", **SEEDED, "stream": True,
                                                       "response_format": "pcm"}) as resp:
        assert resp.status_code == 200
        pieces = [p for p in resp.iter_bytes() if p]
    assert len(pieces) >= 2  # audio leaves before the talker ends
    assert np.array_equal(np.frombuffer(b"".join(pieces), np.int16), audio)

    other = _speech(http, response_format="pcm", seed=2)
    assert other.status_code == 200 and other.content != audio.tobytes()


def _clip() -> str:
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 220 * np.arange(1600) / 16000), 16000, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("body, param", [
    ({"instructions": "a calm voice"}, "instructions"),
    ({"ref_audio": _clip(), "ref_text": "hi"}, "ref_audio"),
    ({"task_type": "Base"}, "task_type"),
    ({"top_k": 5}, "top_k"),
    ({"min_p": 0.1}, "min_p"),
])
def test_unsupported_fields_are_400s_naming_them(http, body, param):
    resp = _speech(http, **body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
