"""Speech route over the real Higgs-Audio v2 pipeline (tiny zoo checkpoint), in process: the
audio, the scene description (`instructions`), streaming, an inline cloned voice, and 400s
naming the field."""

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

ROWS, SAMPLES_PER_FRAME, RATE = 24, 960, 24000
NUM_SAMPLES = (ROWS - 4) * SAMPLES_PER_FRAME  # the all-BOS row, then 3 rows of delay: 20 frames
TEXT = "The sun rises in the east."
# Greedy and short: this text runs to max_tokens (the random model does not end its stream).
OVERRIDES = {"0": {"default_sampling_params": {"max_tokens": ROWS, "temperature": 0}}, "*": {"max_num_seqs": 4}}


@pytest.fixture(scope="module")
def http(zoo):
    registry = CollectorRegistry()
    path = str(zoo("higgs-audio-v2"))
    engine = AsyncOmni(path, stage_overrides=OVERRIDES, metrics_registry=registry)
    app = create_app(ServerSettings(served_model_name="higgs", model_path=path), engine, registry)
    with TestClient(app) as client:
        yield client


def _speech(http, **body):
    return http.post("/v1/audio/speech", json={"input": TEXT, "voice": "alloy", **body})


def test_speech_streams_and_follows_the_scene(http):
    wav = _speech(http, response_format="wav")
    assert wav.status_code == 200, wav.text
    audio, rate = sf.read(io.BytesIO(wav.content), dtype="int16")
    assert rate == RATE and len(audio) == NUM_SAMPLES and np.abs(audio).max() > 0

    with http.stream("POST", "/v1/audio/speech", json={"input": TEXT, "voice": "alloy", "response_format": "pcm",
                                                       "stream_format": "audio"}) as resp:
        assert resp.status_code == 200
        pieces = [p for p in resp.iter_bytes() if p]
    assert len(pieces) >= 2  # audio leaves before the talker ends
    assert np.array_equal(np.frombuffer(b"".join(pieces), np.int16), audio)

    # The scene description is part of the prompt: another scene, other speech.
    street = _speech(http, response_format="pcm", instructions="Audio is recorded in a busy street.")
    assert street.status_code == 200 and street.content != audio.tobytes()


def test_inline_reference_audio_clones_a_voice(http):
    t = np.arange(16000) / 16000
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 220 * t), 16000, format="WAV")
    cloned = _speech(http, response_format="pcm", ref_audio=base64.b64encode(buf.getvalue()).decode(),
                     ref_text="This is my voice.")
    assert cloned.status_code == 200, cloned.text
    assert 0 < len(cloned.content) and cloned.content != _speech(http, response_format="pcm").content


@pytest.mark.parametrize("body, param", [
    ({"instructions": " "}, "instructions"),
    ({"ref_audio": base64.b64encode(b"RIFF").decode(), "ref_text": "hi"}, "ref_audio"),
    ({"ref_text": "hi"}, "ref_text"),
    ({"task_type": "Base"}, "task_type"),
])
def test_unsupported_or_bad_fields_are_400s_naming_them(http, body, param):
    resp = _speech(http, **body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
