"""Speech route over the real VoxCPM2 pipeline (tiny zoo checkpoint), in process: the audio,
streaming, the seed, a designed voice (`instructions`), inline cloned voices, and 400s naming
the field."""

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

PATCHES, SAMPLES_PER_PATCH, RATE = 6, 48, 48000  # the tiny VAE: 2 latent steps x 24 samples per patch
TEXT = "The sun rises in the east."
SEEDED = {"seed": 7, "max_new_tokens": PATCHES}


@pytest.fixture(scope="module")
def http(zoo):
    registry = CollectorRegistry()
    path = str(zoo("voxcpm2"))
    engine = AsyncOmni(path, stage_overrides={"*": {"max_num_seqs": 4}}, metrics_registry=registry)
    app = create_app(ServerSettings(served_model_name="voxcpm2", model_path=path), engine, registry)
    with TestClient(app) as client:
        yield client


def _speech(http, **body):
    return http.post("/v1/audio/speech", json={"input": TEXT, "voice": "alloy", **SEEDED, **body})


def _clip() -> str:
    t = np.arange(1600) / 16000  # 0.1 s, the shortest clip the route takes
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 220 * t), 16000, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def test_speech_streams_and_follows_seed_and_design(http):
    wav = _speech(http, response_format="wav")
    assert wav.status_code == 200, wav.text
    audio, rate = sf.read(io.BytesIO(wav.content), dtype="int16")
    assert rate == RATE and len(audio) % SAMPLES_PER_PATCH == 0 and 0 < len(audio) <= PATCHES * SAMPLES_PER_PATCH
    assert np.abs(audio).max() > 0

    with http.stream("POST", "/v1/audio/speech", json={"input": TEXT, "voice": "alloy", **SEEDED,
                                                       "response_format": "pcm", "stream_format": "audio"}) as resp:
        assert resp.status_code == 200
        pieces = [p for p in resp.iter_bytes() if p]
    assert len(pieces) >= 2  # audio leaves before the talker ends
    assert np.array_equal(np.frombuffer(b"".join(pieces), np.int16), audio)

    # The seed draws the DiT's noise: another seed, other speech.
    assert _speech(http, response_format="pcm", seed=8).content != audio.tobytes()
    # The designed voice is part of the prompt: other speech.
    designed = _speech(http, response_format="pcm", instructions="a calm, deep voice")
    assert designed.status_code == 200 and designed.content != audio.tobytes()


def test_inline_reference_audio_clones_a_voice(http):
    plain = _speech(http, response_format="pcm").content
    cloned = _speech(http, response_format="pcm", ref_audio=_clip())
    continued = _speech(http, response_format="pcm", ref_audio=_clip(), ref_text="This is my voice.")
    for resp in (cloned, continued):
        assert resp.status_code == 200, resp.text
        assert 0 < len(resp.content) and resp.content != plain
    assert cloned.content != continued.content


@pytest.mark.parametrize("body, param", [
    ({"instructions": " "}, "instructions"),
    ({"instructions": "warm", "ref_audio": _clip(), "ref_text": "hi"}, "instructions"),
    ({"ref_audio": base64.b64encode(b"RIFF").decode(), "ref_text": "hi"}, "ref_audio"),
    ({"ref_text": "hi"}, "ref_text"),
    ({"task_type": "Base"}, "task_type"),
])
def test_unsupported_or_bad_fields_are_400s_naming_them(http, body, param):
    resp = _speech(http, **body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
