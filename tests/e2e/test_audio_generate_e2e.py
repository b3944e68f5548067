"""`omnistage serve` on the tiny Stable Audio zoo model: POST /v1/audio/generate
with httpx (the official `openai` client has no method for it), /v1/models, and a bad field."""

from __future__ import annotations

import io

import pytest
import soundfile as sf
from remote_server import RemoteServer

pytestmark = pytest.mark.e2e


def test_stable_audio_generates_wav_and_names_bad_fields(zoo):
    with RemoteServer(zoo("stable-audio"), "--served-model-name", "stable-audio", in_process=True) as server:
        http = server.http()
        (model,) = http.get("/v1/models").json()["data"]
        assert model["routes"] == ["POST /v1/audio/generate"]

        response = http.post("/v1/audio/generate", json={
            "model": "stable-audio", "prompt": "rain on a tin roof", "negative_prompt": "low quality",
            "duration_seconds": 0.75, "num_inference_steps": 2, "seed": 7, "response_format": "wav"})
        assert response.status_code == 200, response.text
        info = sf.info(io.BytesIO(response.content))
        assert (info.samplerate, info.channels, info.frames) == (8000, 2, 6000)

        response = http.post("/v1/audio/generate", json={"prompt": "x", "duration_seconds": 60})
        assert response.status_code == 400 and response.json()["error"]["param"] == "duration_seconds"
        assert http.post("/v1/audio/speech", json={"input": "hi", "voice": "alloy"}).status_code == 400
