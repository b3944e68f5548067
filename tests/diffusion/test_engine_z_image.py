"""DiffusionEngine on the real tiny Z-Image zoo checkpoint: batching, step mode and the
multiprocess executor never change a request's image."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from fake_diffusion import child_pids
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.core.types import StageRequest
from omnistage.diffusion.engine import DiffusionEngine
from omnistage.diffusion.executor import WorkerDiedError
from omnistage.diffusion.params import DiffusionParams
from omnistage.models.z_image.pipeline import ZImage

PROMPTS = ["a cat", "a photo of a small dog on a long red wooden chair", "a tree in the snow"]
EXTRAS = {"max_sequence_length": 32}


def req(rid: str, prompt: str, seed: int, steps: int = 3) -> StageRequest:
    params = DiffusionParams(height=32, width=32, num_inference_steps=steps, guidance_scale=3.0, seed=seed,
                             extras=EXTRAS)
    return StageRequest(rid, prompt, params)


def run(engine: DiffusionEngine) -> dict[str, list]:
    outputs: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def pixels(output) -> np.ndarray:
    assert output.finished and output.error is None, output.error
    return np.stack([np.asarray(img) for img in output.payload.images]).astype(np.int16)


def assert_same_image(a: np.ndarray, b: np.ndarray) -> None:
    # Batched transformer calls pad prompts, so floats differ in the last bits; after
    # rounding to uint8 that is at most one level.
    assert np.abs(a - b).max() <= 1


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("z-image")


@pytest.fixture(scope="module")
def alone(path):
    """Each prompt's image, run alone in request mode (the class named by the stage spec)."""
    stage = StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                      model="ZImagePipeline")
    engine = DiffusionEngine(path, stage)
    assert engine.pipeline_cls is ZImage
    images = images_alone(engine, PROMPTS)
    engine.close()
    return images


def images_alone(engine: DiffusionEngine, prompts: list[str]) -> dict[int, np.ndarray]:
    """Each prompt's image (its seed is its index), run alone on `engine`."""
    images = {}
    for i, prompt in enumerate(prompts):
        engine.add_request(req(f"r{i}", prompt, seed=i))
        images[i] = pixels(run(engine)[f"r{i}"][-1])
    return images


def test_request_mode_batch_matches_alone(path, alone):
    # No stage: the class comes from the checkpoint's model_index.json.
    engine = DiffusionEngine(path, config=StageDeployConfig(max_num_seqs=4, request_batch_max_wait_ms=50))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(req(f"r{i}", prompt, seed=i))
    outs = run(engine)
    for i in range(3):
        final = outs[f"r{i}"][-1]
        assert final.metrics["batch_size"] == 3 and engine.pipeline_cls is ZImage
        assert [o.payload.step for o in outs[f"r{i}"][:-1]] == [1, 2, 3]
        assert_same_image(pixels(final), alone[i])
    engine.close()


def test_step_mode_staggered_joins_and_abort_match_alone(path, alone):
    engine = DiffusionEngine(path, config=StageDeployConfig(step_execution=True, max_num_seqs=4))
    outs: dict[str, list] = {}

    def tick():
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)

    engine.add_request(req("r0", PROMPTS[0], seed=0))
    engine.add_request(req("gone", "to be aborted", seed=9, steps=6))
    tick()
    engine.add_request(req("r1", PROMPTS[1], seed=1))
    tick()
    engine.abort_request("gone")
    engine.add_request(req("r2", PROMPTS[2], seed=2))
    while engine.has_unfinished_requests():
        tick()
    assert not any(o.finished for o in outs["gone"])
    assert engine.executor.worker.runner.states == {}
    for i in range(3):
        assert_same_image(pixels(outs[f"r{i}"][-1]), alone[i])
    engine.close()


def test_mp_two_ranks_match_uni_stream_progress_and_survive_a_killed_worker(path, alone):
    """One mp engine start (each worker pays the torch import): the progress and abort checks of
    request mode, then a killed worker."""
    children_before = child_pids()
    config = StageDeployConfig(executor="mp", num_devices=2, cfg_parallel_size=2, max_num_seqs=2,
                               request_batch_max_wait_ms=1000)
    engine = DiffusionEngine(path, config=config)
    try:
        assert_progress_is_live_and_abort_stops_within_a_step(engine, alone)

        engine.add_request(req("long", PROMPTS[1], seed=1, steps=1000))
        threading.Timer(1.0, os.kill, (engine.executor.pids[0], signal.SIGKILL)).start()
        deadline = time.monotonic() + 60
        # A dead worker is a typed error out of step(): the stage's supervisor fails "long".
        with pytest.raises(WorkerDiedError, match="rank 0 .*died"):
            while time.monotonic() < deadline:
                engine.step()
        assert not engine.is_healthy()
        with pytest.raises(RuntimeError, match="unhealthy"):
            engine.add_request(req("after", PROMPTS[0], seed=0))
    finally:
        engine.close()
    assert child_pids() <= children_before
    assert not [name for name in os.listdir("/dev/shm") if name.startswith("omnistage_")]


def test_request_mode_progress_is_live_and_abort_stops_within_a_step(path, alone):
    engine = DiffusionEngine(path, config=StageDeployConfig(max_num_seqs=2, request_batch_max_wait_ms=1000))
    try:
        assert_progress_is_live_and_abort_stops_within_a_step(engine, alone)
        assert engine.executor.worker.runner.states == {}
    finally:
        engine.close()


def assert_progress_is_live_and_abort_stops_within_a_step(engine: DiffusionEngine, alone) -> None:
    """Request mode is step-wise too: each engine step is one denoising step, so progress
    leaves as it happens and an aborted request stops computing at once, while the other
    request of its batch finishes with the image it has alone (uni and mp executors)."""
    engine.add_request(req("r0", PROMPTS[0], seed=0))
    engine.add_request(req("gone", PROMPTS[1], seed=1))
    first = engine.step()
    assert {(o.request_id, o.payload.step) for o in first} == {("r0", 1), ("gone", 1)}
    engine.abort_request("gone")
    outs = run(engine)
    assert set(outs) == {"r0"}  # nothing more for the aborted one
    assert [o.payload.step for o in outs["r0"][:-1]] == [2, 3]
    assert_same_image(pixels(outs["r0"][-1]), alone[0])

    engine.scheduler.max_wait = 0  # a lone request: no burst to wait for (left so)
    engine.add_request(req("long", PROMPTS[2], seed=2, steps=1000))
    for step in (1, 2, 3):
        (progress,) = engine.step()
        assert (progress.payload.step, progress.payload.num_steps, progress.finished) == (step, 1000, False)
    engine.abort_request("long")
    assert engine.step() == [] and not engine.has_unfinished_requests()  # freed; 997 steps never run
