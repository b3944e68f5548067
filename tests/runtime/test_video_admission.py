"""`POST /v1/videos` over a supervised fake video stage: what the stage would refuse on
arrival is a 400 before a job exists (bad inputs, a request that crashed the stage twice),
and a job the stage refuses or crashes on later ends `failed` with the cause in its error."""

from __future__ import annotations

import time

import pytest
from engine.fake_engines import FakeEngine
from fastapi.testclient import TestClient
from runtime.test_supervised_server import wait_healthy

from omnistage.config import PipelineSpec, StageSpec
from omnistage.entrypoints.omni import AsyncOmni
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

SPEC = PipelineSpec("fake-video", (StageSpec(0, "diffusion", "diffusion", "video", final_output=True),))


def wait_done(http: TestClient, video_id: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while (job := http.get(f"/v1/videos/{video_id}").json())["status"] in ("queued", "in_progress"):
        assert time.monotonic() < deadline, f"job {video_id} stayed {job['status']}"
        time.sleep(0.02)
    return job


@pytest.fixture
def server(tmp_path):
    engine = AsyncOmni(tmp_path, pipeline=SPEC, engine_factory=FakeEngine,
                       stage_overrides={"0": {"max_restarts": 3, "restart_backoff_s": 0.05}})
    app = create_app(ServerSettings(served_model_name="fake", model_path=str(tmp_path)), engine)
    with TestClient(app) as http:
        yield http, engine


def test_inputs_the_stage_refuses_are_a_400_before_any_job_exists(server):
    http, engine = server
    resp = http.post("/v1/videos", data={"prompt": "poison"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"].startswith("stage 0 (diffusion): poisoned input")
    assert http.get("/v1/videos").json()["data"] == []
    ok = http.post("/v1/videos", data={"prompt": "a wave"}).json()
    assert wait_done(http, ok["id"])["status"] == "completed"


def test_a_job_refused_after_it_was_queued_fails_with_the_cause(server):
    http, _ = server
    job = http.post("/v1/videos", data={"prompt": "fail"}).json()
    assert job["status"] == "queued"
    done = wait_done(http, job["id"])
    assert done["status"] == "failed" and "the fake engine failed" in done["error"]["message"], done


def test_a_request_that_crashed_the_stage_twice_is_refused_at_admission(server):
    http, engine = server
    for crash in range(2):
        job = http.post("/v1/videos", data={"prompt": "panic"})
        assert job.status_code == 200, job.text  # no crash on record yet: the stage takes it
        done = wait_done(http, job.json()["id"])
        assert done["status"] == "failed" and "panicked" in done["error"]["message"], done
        wait_healthy(http)
    refused = http.post("/v1/videos", data={"prompt": "panic"})
    assert refused.status_code == 400 and "crashed the stage 2 times" in refused.json()["error"]["message"]
    assert len(http.get("/v1/videos").json()["data"]) == 2  # no third job
    ok = http.post("/v1/videos", data={"prompt": "a wave"}).json()
    assert wait_done(http, ok["id"])["status"] == "completed"
    assert engine.orchestrator.handles[0].num_restarts == 2
