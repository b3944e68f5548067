"""Speech route over the real MOSS-TTS pipeline (tiny zoo checkpoint), in process: the audio,
streaming, the seed, a described voice (`instructions`) and a `language`, and 400s naming
the field (a reference clip among them: this model cannot clone)."""

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

RATE, SAMPLES_PER_FRAME = 24000, 1920
TEXT = "Hello world! How are you today?"
SEEDED = {"seed": 5, "max_new_tokens": 48}  # seed 5 ends its reply (9 frames) within 48 steps


@pytest.fixture(scope="module")
def http(zoo):
    registry = CollectorRegistry()
    path = str(zoo("moss-tts"))
    engine = AsyncOmni(path, stage_overrides={"*": {"max_num_seqs": 4}}, metrics_registry=registry)
    app = create_app(ServerSettings(served_model_name="moss-tts", model_path=path), engine, registry)
    with TestClient(app) as client:
        yield client


def _speech(http, **body):
    return http.post("/v1/audio/speech", json={"input": TEXT, "voice": "alloy", **SEEDED, **body})


def test_speech_streams_and_follows_the_prompt(http):
    wav = _speech(http, response_format="wav")
    assert wav.status_code == 200, wav.text
    audio, rate = sf.read(io.BytesIO(wav.content), dtype="int16")
    assert rate == RATE and len(audio) == 9 * SAMPLES_PER_FRAME and np.abs(audio).max() > 0

    with http.stream("POST", "/v1/audio/speech", json={"input": TEXT, "voice": "alloy", **SEEDED,
                                                       "response_format": "pcm", "stream_format": "audio"}) as resp:
        assert resp.status_code == 200
        pieces = [p for p in resp.iter_bytes() if p]
    assert len(pieces) >= 2  # audio leaves before the talker ends
    assert np.array_equal(np.frombuffer(b"".join(pieces), np.int16), audio)

    # The described voice and the language are part of the prompt: other speech.
    for field in ({"instructions": "a calm, deep voice"}, {"language": "English"}):
        other = _speech(http, response_format="pcm", **field)
        assert other.status_code == 200 and other.content != audio.tobytes(), field


def _clip() -> str:
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 220 * np.arange(1600) / 16000), 16000, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("body, param", [
    ({"instructions": " "}, "instructions"),
    ({"language": " "}, "language"),
    ({"ref_audio": _clip()}, "ref_audio"),
    ({"ref_audio": _clip(), "ref_text": "hi"}, "ref_audio"),
    ({"task_type": "Base"}, "task_type"),
    ({"speed_factor": 2}, "speed_factor"),
])
def test_unsupported_or_bad_fields_are_400s_naming_them(http, body, param):
    resp = _speech(http, **body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
