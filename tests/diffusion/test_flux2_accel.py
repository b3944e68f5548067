"""FLUX.2 with the accelerations: the step caches over its single-stream blocks (threshold 0
is the plain output bit for bit, a high one skips, alone equals batched at other steps),
cache-dit, the memory options (offload, int8 weights), and what it refuses by name. CFG
parallel and Ulysses run for klein in test_declared_accelerations.py and test_sequence_parallel.py
with the other families."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.models.flux2.klein_pipeline import Flux2Klein
from omnistage.models.flux2.pipeline import Flux2
from omnistage.testing import call_kwargs as zoo_call_kwargs

from parity import BATCH_PROMPTS, BATCH_SEEDS, request_for

CLASSES = {"flux2": Flux2, "flux2-klein": Flux2Klein}
THRESHOLD = {"first_block_cache": "threshold", "tea_cache": "rel_l1_thresh"}
STEPS = 4


def load(path, name: str, **deploy_fields):
    return CLASSES[name].from_pretrained(str(path), deploy=StageDeployConfig(**deploy_fields))


def cached(path, name: str, backend: str, threshold: float):
    return load(path, name, cache_backend=backend, cache_config={THRESHOLD[backend]: threshold})


def request(name: str, seed: int = 3, request_id: str = "req", **overrides):
    return request_for({**zoo_call_kwargs(name), "num_inference_steps": STEPS, **overrides}, seed, request_id)


def run(pipeline, name: str, **overrides):
    """(float output, metrics) of one request run alone."""
    (state,) = pipeline.denoise([request(name, **overrides)])
    return pipeline.decode_arrays([state])[0], pipeline.state_metrics(state)


@pytest.mark.parametrize("name, backend", [
    ("flux2-klein", "first_block_cache"),  # one call per CFG branch, each with its own cache
    ("flux2-klein", "tea_cache"),
    ("flux2", "first_block_cache"),
])
def test_threshold_zero_is_bit_identical_and_a_high_one_skips(zoo, name, backend):
    path = zoo(name)
    base, base_metrics = run(load(path, name), name)
    pipeline = cached(path, name, backend, 0.0)
    assert pipeline.accelerations == [backend]
    arr, metrics = run(pipeline, name)
    assert np.array_equal(arr, base) and metrics == base_metrics and metrics["num_forwards_skipped"] == 0

    arr, metrics = run(cached(path, name, backend, 100.0), name)
    assert metrics["num_forwards_computed"] + metrics["num_forwards_skipped"] == base_metrics["num_forwards_computed"]
    assert metrics["num_forwards_skipped"] > 0 and not np.array_equal(arr, base)


def test_cached_request_alone_equals_batched_at_other_steps(zoo):
    pipeline = cached(zoo("flux2-klein"), "flux2-klein", "first_block_cache", 1.0)  # skips every other step here
    requests = [request("flux2-klein", BATCH_SEEDS[i], f"r{i}", prompt=BATCH_PROMPTS[i]) for i in range(2)]
    alone = []
    for r in requests:
        (state,) = pipeline.denoise([r])
        alone.append((pipeline.decode_arrays([state])[0], pipeline.state_metrics(state)))

    states = pipeline.encode([pipeline.prepare_request(requests[0])])  # the second joins after one step
    pipeline.denoise_step(states)
    states += pipeline.encode([pipeline.prepare_request(requests[1])])
    while any(not s.is_done for s in states):
        pipeline.denoise_step([s for s in states if not s.is_done])
    for state, arr, (arr_alone, metrics_alone) in zip(states, pipeline.decode_arrays(states), alone):
        assert pipeline.state_metrics(state) == metrics_alone and metrics_alone["num_forwards_skipped"] > 0
        assert np.abs(arr - arr_alone).max() <= 1e-3


def test_vae_tiling_applies(zoo):
    assert load(zoo("flux2"), "flux2", vae_use_tiling=True).accelerations == ["vae_tiling"]


@pytest.mark.parametrize("fields, tolerance", [
    (dict(offload="layerwise"), 0.0),
    (dict(offload="model"), 0.0),
    (dict(quantization="int8"), 0.05),  # weight-only int8 of the transformer's linear layers
])
def test_memory_options_keep_the_output(zoo, fields, tolerance):
    path = zoo("flux2-klein")
    base, _ = run(load(path, "flux2-klein"), "flux2-klein", num_inference_steps=2)
    pipeline = load(path, "flux2-klein", **fields)
    assert pipeline.accelerations == [next(iter(fields))]
    arr, _ = run(pipeline, "flux2-klein", num_inference_steps=2)
    assert np.abs(arr - base).max() <= tolerance


def test_cache_dit_knows_flux2(zoo):
    # cache-dit's own FLUX.2 adapter (both block lists); one request at a time.
    pytest.importorskip("cache_dit")
    path = zoo("flux2-klein")
    base, base_metrics = run(load(path, "flux2-klein"), "flux2-klein")
    pipeline = load(path, "flux2-klein", cache_backend="cache_dit", max_num_seqs=1,
                    cache_config={"max_warmup_steps": 1, "residual_diff_threshold": 100.0})
    assert pipeline.accelerations == ["cache_dit"]
    arr, metrics = run(pipeline, "flux2-klein")
    assert metrics["num_forwards_skipped"] > 0 and not np.array_equal(arr, base)
    assert metrics["num_forwards_computed"] + metrics["num_forwards_skipped"] == base_metrics["num_forwards_computed"]
