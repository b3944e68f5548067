"""DiffusionEngine with executor mp under a sequence-parallel degree (ulysses_degree=2 on two
CPU ranks, real tiny Z-Image): step mode with a request joining a running batch returns the
images one rank gives, and a killed worker fails its request within seconds and marks the
stage unhealthy. One engine start (each worker pays the torch import)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from fake_diffusion import child_pids
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.engine import DiffusionEngine
from omnistage.diffusion.executor import WorkerDiedError

from test_engine_z_image import PROMPTS, assert_same_image, images_alone, pixels, req, run


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("z-image")


def test_step_mode_under_ulysses_matches_one_rank_and_a_killed_worker_fails_fast(path):
    engine = DiffusionEngine(path, config=StageDeployConfig(max_num_seqs=2))
    alone = images_alone(engine, PROMPTS[:2])
    engine.close()

    children_before = child_pids()
    config = StageDeployConfig(executor="mp", num_devices=2, ulysses_degree=2, step_execution=True, max_num_seqs=2)
    engine = DiffusionEngine(path, config=config)
    try:
        engine.add_request(req("r0", PROMPTS[0], seed=0))
        outs = {"r0": engine.step()}
        engine.add_request(req("r1", PROMPTS[1], seed=1))  # joins the running batch
        for rid, out in run(engine).items():
            outs.setdefault(rid, []).extend(out)
        for i in range(2):
            assert_same_image(pixels(outs[f"r{i}"][-1]), alone[i])

        engine.add_request(req("long", PROMPTS[2], seed=2, steps=1000))
        threading.Timer(1.0, os.kill, (engine.executor.pids[1], signal.SIGKILL)).start()
        started = time.monotonic()
        # A dead worker is a typed error out of step(): the stage's supervisor fails "long".
        with pytest.raises(WorkerDiedError, match="rank 1 .*died"):
            while time.monotonic() < started + 60:
                engine.step()
        assert time.monotonic() - started < 15  # seconds, not a collective's timeout
        assert not engine.is_healthy()
    finally:
        engine.close()
    assert child_pids() <= children_before
