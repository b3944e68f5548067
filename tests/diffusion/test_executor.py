"""The multiprocess executor: two CPU ranks in a gloo group, results over shared memory,
a killed worker failing its requests and the engine, and a clean close. Kept to one
engine start: every worker process pays the torch import."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest

from fake_diffusion import FakePipeline, child_pids, make_fake_model
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.types import ImagePayload, StageRequest
from omnistage.diffusion.engine import DiffusionEngine
from omnistage.diffusion.executor import WorkerDiedError
from omnistage.runtime.channel import Channel, sweep_shm

SHM_DIR = "/dev/shm"
from omnistage.diffusion.params import DiffusionParams


def run(engine: DiffusionEngine) -> dict[str, list]:
    outputs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def pixels(output) -> np.ndarray:
    return np.stack([np.asarray(img) for img in output.payload.images])


def req(rid: str, prompt: str, **params) -> StageRequest:
    return StageRequest(rid, prompt, DiffusionParams(seed=11, **params))


def shm_entries() -> set[str]:
    """Our segments only: other work on the machine may create its own meanwhile."""
    return {name for name in os.listdir(SHM_DIR) if name.startswith("omnistage_")}


def test_shm_round_trip_and_sweep():
    from PIL import Image

    prefix = f"omnistage_test_{os.getpid()}_"
    channel = Channel("shm", prefix, threshold_bytes=100)  # the executor's channel, with a small threshold
    image = Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 4, 3))
    packed = channel.put({"payload": ImagePayload([image]), "frames": np.ones((2, 3), np.float32)})
    assert packed.segment is not None and os.path.exists(os.path.join(SHM_DIR, packed.segment))
    value = channel.get(packed)
    np.testing.assert_array_equal(np.asarray(value["payload"].images[0]), np.asarray(image))
    assert value["frames"].dtype == np.float32 and not os.path.exists(os.path.join(SHM_DIR, packed.segment))
    assert channel.put({"small": 1}).segment is None  # nothing out-of-band: no segment
    channel.put(np.zeros(3))  # a leftover, as from a killed worker
    assert sweep_shm(prefix) == 1 and not [n for n in shm_entries() if n.startswith(prefix)]


def test_mp_two_ranks_match_uni_and_a_killed_worker_fails_fast(tmp_path):
    children_before = child_pids()
    shm_before = shm_entries()
    model = make_fake_model(tmp_path / "m", step_delay=0.05)
    prompts = {"a": "a cat", "b": "a dog"}

    uni = DiffusionEngine(model, config=StageDeployConfig(max_num_seqs=2), pipeline_cls=FakePipeline)
    for rid, prompt in prompts.items():
        uni.add_request(req(rid, prompt))
    expected = {rid: pixels(outs[-1]) for rid, outs in run(uni).items()}
    uni.close()

    engine = DiffusionEngine(model, config=StageDeployConfig(executor="mp", num_devices=2, cfg_parallel_size=2, max_num_seqs=2),
                             pipeline_cls=FakePipeline, show_progress=True)
    try:
        pids = engine.executor.pids
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert child_pids() >= set(pids)
        # Bad input is caught by the rank-0 pipeline and crosses back as the caller's ValueError.
        with pytest.raises(ValueError, match="height"):
            engine.add_request(req("bad", "x", height=12))

        for rid, prompt in prompts.items():
            engine.add_request(req(rid, prompt))
        outs = run(engine)
        for rid in prompts:
            assert [o.payload.step for o in outs[rid][:-1]] == [1, 2, 3]
            assert outs[rid][-1].metrics["batch_size"] == 2
            np.testing.assert_array_equal(pixels(outs[rid][-1]), expected[rid])
        assert not [n for n in shm_entries() if n.startswith(engine.executor.shm_prefix)]

        # Kill rank 1 in the middle of a long batch: step() raises a typed WorkerDiedError (the
        # stage's supervisor fails what it held), the engine turns unhealthy and refuses new
        # work instead of hanging.
        engine.add_request(req("long", "slow", num_inference_steps=1000))
        engine.add_request(req("queued", "slow", num_inference_steps=3, height=8))  # other key: waits
        threading.Timer(0.5, os.kill, (pids[1], signal.SIGKILL)).start()
        deadline = time.monotonic() + 30
        with pytest.raises(WorkerDiedError) as died:
            while time.monotonic() < deadline:
                engine.step()
        assert "rank 1" in str(died.value) and "SIGKILL" in str(died.value)
        assert not died.value.crashed, "killed from outside: no request is to blame"
        assert not engine.is_healthy()
        with pytest.raises(RuntimeError, match="unhealthy"):
            engine.add_request(req("after", "x"))
        with pytest.raises(WorkerDiedError):
            engine.executor.worker_pids()
    finally:
        engine.close()
    assert child_pids() <= children_before
    assert not any(psutil.pid_exists(pid) for pid in pids)
    assert shm_entries() <= shm_before
