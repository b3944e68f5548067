"""POST /v1/omni/sleep and /v1/omni/wakeup on a real AsyncOmni whose stage has two replica
processes (fake engines): sleep reaches every copy, requests meanwhile get 503 +
Retry-After, is_sleeping says so, and after wakeup requests are served again; a copy killed
while asleep is rebuilt asleep; a level this version does not implement is a 400 naming
`level`; a weight update reaches every copy, and a copy rebuilt later gets it too."""

from __future__ import annotations

import functools
import os
import signal
import time

import pytest
from engine.fake_engines import FakeEngine
from fastapi.testclient import TestClient

from omnistage.config import PipelineSpec, StageSpec
from omnistage.entrypoints.omni import AsyncOmni
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

DRAW = PipelineSpec("draw", (StageSpec(0, "drawer", "diffusion", "image", final_output=True),))
IMAGE = {"prompt": "a cat", "size": "64x64"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    engine = AsyncOmni(path, pipeline=DRAW, engine_factory=functools.partial(FakeEngine, num_steps=2),
                       stage_overrides={"0": {"runtime": "process", "num_replicas": 2}})
    with TestClient(create_app(ServerSettings(served_model_name="fake", model_path=str(path)), engine)) as http:
        yield http, engine


def test_sleep_refuses_requests_on_every_replica_until_wakeup(served):
    http, engine = served
    assert http.post("/v1/images/generations", json=IMAGE).status_code == 200
    slept = http.post("/v1/omni/sleep", json={"level": 1})
    assert slept.status_code == 200 and slept.json() == {"is_sleeping": True, "level": 1, "freed_bytes": 2000}
    assert engine.orchestrator.handles[0].call("is_sleeping").result(timeout=10) == [True, True]
    refused = http.post("/v1/images/generations", json=IMAGE)
    assert refused.status_code == 503 and refused.headers["retry-after"].isdigit()
    assert "asleep" in refused.json()["error"]["message"]
    assert http.get("/v1/omni/is_sleeping").json()["is_sleeping"] is True
    assert http.get("/health").status_code == 200  # asleep is not down: nothing to restart
    woken = http.post("/v1/omni/wakeup")
    assert woken.status_code == 200 and woken.json()["is_sleeping"] is False
    assert engine.orchestrator.handles[0].call("is_sleeping").result(timeout=10) == [False, False]
    assert http.post("/v1/images/generations", json=IMAGE).status_code == 200


def test_an_unimplemented_sleep_level_is_a_400_naming_it(served):
    http, engine = served
    resp = http.post("/v1/omni/sleep", json={"level": 3})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "level", resp.text
    assert not engine.is_sleeping


def kill_and_wait_rebuilt(replica) -> None:
    """SIGKILL the replica's process and wait (30 s at most) until the supervisor has rebuilt it."""
    os.kill(replica.endpoint.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while replica.num_restarts == 0 or not replica.is_healthy():
        assert time.monotonic() < deadline, "the killed copy was not rebuilt"
        time.sleep(0.02)


def test_a_copy_rebuilt_while_asleep_comes_back_asleep(served):
    http, engine = served
    handle = engine.orchestrator.handles[0]
    assert http.post("/v1/omni/sleep").status_code == 200
    kill_and_wait_rebuilt(handle.replicas[0])
    assert handle.call("is_sleeping").result(timeout=10) == [True, True]
    assert http.post("/v1/omni/wakeup").status_code == 200
    assert handle.call("is_sleeping").result(timeout=10) == [False, False]
    assert http.post("/v1/images/generations", json=IMAGE).status_code == 200


def test_update_weights_reaches_every_copy_and_a_rebuilt_copy_gets_it_too(served, tmp_path):
    http, engine = served
    handle = engine.orchestrator.handles[0]
    resp = http.post("/v1/omni/update_weights", json={"stage": "drawer", "path": str(tmp_path)})
    assert resp.status_code == 200 and resp.json() == {"stage": "drawer", "num_tensors": 7}, resp.text
    assert handle.call("weights_from").result(timeout=10) == [str(tmp_path)] * 2
    kill_and_wait_rebuilt(handle.replicas[1])
    assert handle.call("weights_from").result(timeout=10) == [str(tmp_path)] * 2  # not its start-up weights
    assert http.post("/v1/images/generations", json=IMAGE).status_code == 200
