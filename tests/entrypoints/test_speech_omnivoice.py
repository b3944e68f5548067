"""Speech route over the real OmniVoice pipeline (tiny zoo checkpoint), in process: streamed
audio equal to the whole answer, the seed, a designed voice (`instructions`) and a cloned one
(`ref_audio` + `ref_text`), and 400s naming the field."""

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

TEXT = "Hello world! How are you today?"


@pytest.fixture(scope="module")
def http(zoo):
    registry = CollectorRegistry()
    path = str(zoo("omnivoice"))
    # 4 unmasking steps (the authors' 32) for time: every step runs the same code.
    engine = AsyncOmni(path, stage_overrides={"0": {"default_sampling_params": {"num_inference_steps": 4}}},
                       metrics_registry=registry)
    app = create_app(ServerSettings(served_model_name="omnivoice", model_path=path), engine, registry)
    with TestClient(app) as client:
        yield client


def _speech(http, **body):
    return http.post("/v1/audio/speech", json={"input": TEXT, "voice": "alloy", "seed": 3, **body})


def _clip() -> str:
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 220 * np.arange(16000) / 16000), 16000, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def test_speech_streams_and_follows_the_voice(http):
    whole = _speech(http, response_format="pcm")
    assert whole.status_code == 200, whole.text
    audio = np.frombuffer(whole.content, np.int16)
    assert len(audio) > 24000 and np.abs(audio).max() > 0  # more than one chunk of 25 frames

    with http.stream("POST", "/v1/audio/speech", json={"input": TEXT, "voice": "alloy", "seed": 3,
                                                       "response_format": "pcm", "stream": True}) as resp:
        assert resp.status_code == 200
        pieces = [p for p in resp.iter_bytes() if p]
    assert len(pieces) >= 2  # a second of frames at a time (all in one piece without chunking)
    assert b"".join(pieces) == whole.content

    assert _speech(http, response_format="pcm", seed=4).content != whole.content
    for field in ({"instructions": "female, low pitch"}, {"ref_audio": _clip(), "ref_text": "A clip of mine."}):
        other = _speech(http, response_format="pcm", **field)
        assert other.status_code == 200, other.text
        assert other.content != whole.content, field


@pytest.mark.parametrize("body, param", [
    ({"instructions": "purple voice"}, "instructions"),
    ({"instructions": "male, female"}, "instructions"),
    ({"ref_audio": _clip()}, "ref_text"),
    ({"max_new_tokens": 40}, "max_new_tokens"),
    ({"task_type": "Base"}, "task_type"),
    ({"speed_factor": 2}, "speed_factor"),
])
def test_bad_fields_are_400s_naming_them(http, body, param):
    resp = _speech(http, **body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_the_unmasking_stage_fields_through_extra_body(http):
    plain = _speech(http, response_format="pcm").content
    for fields in ({"num_inference_steps": 2}, {"guidance_scale": 0.5}, {"position_temperature": 0.0},
                   {"extra_params": {"class_temperature": 1.0}}):
        other = _speech(http, response_format="pcm", **fields)
        assert other.status_code == 200 and other.content != plain, fields
    for fields, param in (({"t_shift": 0}, "t_shift"), ({"num_inference_steps": 0}, "num_inference_steps"),
                          ({"height": 64}, "height")):
        resp = _speech(http, **fields)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
