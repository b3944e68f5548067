"""Weight updates and sleep level 2 on a diffusion stage (the tiny Z-Image zoo checkpoint, seeds
0 and 1: same shapes, other weights): after `update_weights` the engine draws exactly what a fresh
load of the new checkpoint draws; an update asked mid-request is refused (no request sees a mix);
sleep level 2 frees every weight and wake-up reads them back to the same image."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.core.types import StageRequest
from omnistage.core.weights import read_checkpoint
from omnistage.diffusion.engine import DiffusionEngine
from omnistage.diffusion.params import DiffusionParams

STAGE = StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="ZImagePipeline")
COMPONENTS = ("transformer", "text_encoder", "vae")


def draw(engine: DiffusionEngine, rid: str) -> np.ndarray:
    params = DiffusionParams(height=32, width=32, num_inference_steps=2, guidance_scale=3.0, seed=7,
                             extras={"max_sequence_length": 32})
    engine.add_request(StageRequest(rid, "a cat", params))
    last = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            last = out
    assert last.finished and last.error is None, last.error
    return np.asarray(last.payload.images[0]).astype(np.int16)


@pytest.fixture(scope="module")
def checkpoints(zoo):
    return zoo("z-image"), zoo("z-image", seed=1)


def test_update_equals_a_fresh_load_and_sleep_level_2_reads_the_weights_back(checkpoints):
    old_path, new_path = checkpoints
    fresh = DiffusionEngine(str(new_path), STAGE, StageDeployConfig())
    try:
        expected = draw(fresh, "fresh")
    finally:
        fresh.close()
    engine = DiffusionEngine(str(old_path), STAGE, StageDeployConfig())
    try:
        before = draw(engine, "old")
        assert np.abs(before - expected).max() > 8  # the checkpoints draw differently
        engine.add_request(StageRequest("running", "a dog", DiffusionParams(height=32, width=32, num_inference_steps=2,
                                                                             extras={"max_sequence_length": 32})))
        engine.step()
        with pytest.raises(RuntimeError, match="still running"):
            engine.update_weights(str(new_path))
        while engine.has_unfinished_requests():
            engine.step()
        num = engine.update_weights(str(new_path))
        assert num == len(read_checkpoint(new_path, COMPONENTS))
        assert np.array_equal(draw(engine, "new"), expected)
        worker = engine.executor.worker
        params = [p for name in COMPONENTS for p in worker.runner.pipeline.components[name].parameters()]
        weight_bytes = sum(p.numel() * p.element_size() for p in params)
        freed = engine.sleep(2)
        assert sum(p.numel() for p in params) == 0 and freed >= weight_bytes  # every weight's storage freed
        engine.wake_up()
        assert np.array_equal(draw(engine, "woken"), expected)
    finally:
        engine.close()
