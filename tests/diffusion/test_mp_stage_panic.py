"""The panic request on an `executor: mp` diffusion stage behind the real app: the worker
process the panic kills fails that request with a 503 + Retry-After, the stage is rebuilt
(/health back to 200, the next request 200), and after two crashes the same request is a
400 at admission, not a third crash. (The same for inline and process stages:
tests/runtime/test_supervised_server.py; the bounded form of the real panic request on an mp
stage: tests/entrypoints/openai/test_openai_request_bounds.py.)"""

from __future__ import annotations

import time

from fake_diffusion import PanickingPipeline, make_fake_model
from fastapi.testclient import TestClient

from omnistage.config import PipelineSpec, StageSpec
from omnistage.diffusion.engine import DiffusionEngine
from omnistage.entrypoints.omni import AsyncOmni
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

SPEC = PipelineSpec("fake-image", (StageSpec(0, "diffusion", "diffusion", "image", final_output=True),))
CAT = {"prompt": "a cat", "size": "16x16", "num_inference_steps": 2}
PANIC = {**CAT, "prompt": "panic"}


def panicking_engine(model_path, stage, config):
    return DiffusionEngine(model_path, stage, config, pipeline_cls=PanickingPipeline)


def wait_healthy(http: TestClient, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while http.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "/health stayed 503"
        time.sleep(0.05)


def test_a_panic_in_an_mp_worker_heals_the_stage_and_is_refused_after_two_crashes(tmp_path):
    model = make_fake_model(tmp_path / "m")
    engine = AsyncOmni(model, pipeline=SPEC, engine_factory=panicking_engine,
                       stage_overrides={"0": {"executor": "mp", "max_restarts": 3, "restart_backoff_s": 0.05}})
    app = create_app(ServerSettings(served_model_name="fake", model_path=model), engine)
    with TestClient(app) as http:
        assert http.post("/v1/images/generations", json=CAT).status_code == 200
        pid = engine.orchestrator.handles[0].endpoint.server.engine.executor.pids[0]
        for crash in range(2):
            resp = http.post("/v1/images/generations", json=PANIC)
            assert resp.status_code == 503 and resp.headers["retry-after"].isdigit(), resp.text
            assert "died" in resp.json()["error"]["message"], resp.json()
            wait_healthy(http)
            assert http.post("/v1/images/generations", json=CAT).status_code == 200
        refused = http.post("/v1/images/generations", json=PANIC)
        assert refused.status_code == 400 and "crashed the stage 2 times" in refused.json()["error"]["message"]
        assert http.get("/health").status_code == 200
        assert http.post("/v1/images/generations", json=CAT).status_code == 200
        assert engine.orchestrator.handles[0].num_restarts == 2
        assert engine.orchestrator.handles[0].endpoint.server.engine.executor.pids[0] != pid  # a new worker
