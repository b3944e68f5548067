"""`executor: ray` on a real two-node local Ray cluster (conftest.py): two ranks of the tiny
Z-Image under ulysses_degree=2, placed on different nodes (SPREAD), give the images the
`mp` executor gives; an actor killed mid-request fails it within seconds and marks the
engine unhealthy (a stage then restarts as with `mp`: restart.py; a restarted Ray stage is
shown in test_ray_runtime.py); close removes the actors and the placement group."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest

from ray_nodes import node_names
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.types import StageRequest
from omnistage.diffusion.engine import DiffusionEngine
from omnistage.diffusion.params import DiffusionParams
from omnistage.runtime.process import WorkerDiedError

pytestmark = pytest.mark.slow  # each rank is a fresh process that imports torch and loads the model

PROMPTS = ["a cat", "a photo of a small dog on a long red wooden chair"]


def req(rid: str, prompt: str, seed: int, steps: int = 3) -> StageRequest:
    return StageRequest(rid, prompt, DiffusionParams(height=32, width=32, num_inference_steps=steps,
                                                     guidance_scale=3.0, seed=seed,
                                                     extras={"max_sequence_length": 32}))


def run(engine: DiffusionEngine) -> dict[str, list]:
    outputs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def pixels(output) -> np.ndarray:
    assert output.finished and output.error is None, output.error
    return np.stack([np.asarray(img) for img in output.payload.images]).astype(np.int16)


def images(engine: DiffusionEngine) -> dict[str, np.ndarray]:
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(req(f"r{i}", prompt, seed=i))
    return {rid: pixels(outs[-1]) for rid, outs in run(engine).items()}


def wait_gone(pids: list[int], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids):
        assert time.monotonic() < deadline, f"worker processes {pids} still running"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("z-image")


def test_two_ranks_on_two_nodes_match_mp_and_a_killed_actor_fails_fast(ray_cluster, path):
    """About 30-40 s on two cores: the mp reference spawns two ranks, then two rank actors each
    import torch and load the model on a fresh Ray worker and form a process group across the two
    nodes, then one is killed and the engine must fail fast. One test, so the ranks start once."""
    import ray

    parallel = dict(num_devices=2, ulysses_degree=2, max_num_seqs=2)
    with DiffusionEngine(path, config=StageDeployConfig(executor="mp", **parallel)) as mp_engine:
        expected = images(mp_engine)

    engine = DiffusionEngine(path, config=StageDeployConfig(executor="ray", ray_placement_strategy="SPREAD",
                                                            **parallel))
    try:
        executor = engine.executor
        names = node_names()
        assert sorted(names[node] for node in executor.node_ids) == ["node_a", "node_b"]
        assert os.getpid() not in executor.pids and len(set(executor.pids)) == 2
        got = images(engine)
        assert got.keys() == expected.keys()
        for rid in got:  # the same ranks on the same math; rounding to uint8 may move one level
            assert np.abs(got[rid] - expected[rid]).max() <= 1

        engine.add_request(req("long", PROMPTS[0], seed=2, steps=1000))
        threading.Timer(1.0, os.kill, (executor.pids[1], signal.SIGKILL)).start()
        started = time.monotonic()
        with pytest.raises(WorkerDiedError, match="rank 1 .*died") as died:  # typed: the supervisor fails "long"
            while time.monotonic() < started + 60:
                engine.step()
        assert not died.value.crashed  # Ray cannot say why an actor died: no request is blamed
        assert time.monotonic() - started < 15  # seconds, not a collective's timeout
        assert not engine.is_healthy()
    finally:
        engine.close()
    wait_gone(executor.pids)
    group = ray.util.placement_group_table(executor.placement_group)
    assert group["state"] == "REMOVED"
