"""The supervisor behind a real app: an inline stage whose engine panics answers that request
with 503 + Retry-After, /health comes back to 200 and the next request is 200 (the server
never stays down); the same request after two crashes is a 400, not a third crash."""

from __future__ import annotations

import time

from engine.fake_engines import FakeEngine
from fastapi.testclient import TestClient

from omnistage.config import PipelineSpec, StageDeployConfig, StageSpec
from omnistage.entrypoints.omni import AsyncOmni
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

SPEC = PipelineSpec("fake-image", (StageSpec(0, "diffusion", "diffusion", "image", final_output=True),))


def wait_healthy(http: TestClient, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while http.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "/health stayed 503"
        time.sleep(0.02)


def test_a_panicking_inline_stage_heals_and_a_poison_request_is_refused(tmp_path):
    engine = AsyncOmni(tmp_path, pipeline=SPEC, engine_factory=FakeEngine,
                       stage_overrides={"0": {"max_restarts": 3, "restart_backoff_s": 0.05}})
    app = create_app(ServerSettings(served_model_name="fake", model_path=str(tmp_path)), engine)
    with TestClient(app) as http:
        poison = {"prompt": "panic", "size": "64x64"}
        for crash in range(2):
            resp = http.post("/v1/images/generations", json=poison)
            assert resp.status_code == 503 and resp.headers["retry-after"].isdigit(), resp.text
            assert "panicked" in resp.json()["error"]["message"]
            wait_healthy(http)
            assert http.post("/v1/images/generations", json={"prompt": "a cat", "size": "64x64"}).status_code == 200
        refused = http.post("/v1/images/generations", json=poison)
        assert refused.status_code == 400 and "crashed the stage 2 times" in refused.json()["error"]["message"]
        assert http.get("/health").status_code == 200
        assert engine.orchestrator.handles[0].num_restarts == 2
