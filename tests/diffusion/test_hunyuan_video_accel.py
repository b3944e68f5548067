"""HunyuanVideo-1.5 with the accelerations (tiny zoo model): the step caches hook its
positional dual-stream blocks (threshold 0 is bit-identical, a high one skips, a request's
output and skips do not depend on who shares its calls), and what it cannot take (sequence
parallel, LoRA) is refused by name at load time. CFG parallel: test_declared_accelerations.py."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.models.hunyuan_video.pipeline import HunyuanVideo15T2V
from omnistage.testing import call_kwargs as zoo_call_kwargs

from parity import BATCH_PROMPTS, BATCH_SEEDS, request_for

NAME = "hunyuan-video"
THRESHOLD = {"first_block_cache": "threshold", "tea_cache": "rel_l1_thresh"}


def call_kwargs(**overrides) -> dict:
    return {**zoo_call_kwargs(NAME), "num_inference_steps": 4, **overrides}


def load(path, **deploy_fields) -> HunyuanVideo15T2V:
    return HunyuanVideo15T2V.from_pretrained(str(path), deploy=StageDeployConfig(**deploy_fields))


def cached(path, backend: str, threshold: float) -> HunyuanVideo15T2V:
    return load(path, cache_backend=backend, cache_config={THRESHOLD[backend]: threshold})


def run(pipeline, seed: int = 3, **overrides):
    """(float output, metrics) of one request run alone."""
    (state,) = pipeline.denoise([request_for(call_kwargs(**overrides), seed=seed)])
    (arr,) = pipeline.decode_arrays([state])
    return arr, pipeline.state_metrics(state)


@pytest.fixture(scope="module")
def path(zoo):
    return zoo(NAME)


@pytest.fixture(scope="module")
def uncached(path):
    return run(load(path))


@pytest.mark.parametrize("backend", list(THRESHOLD))
def test_threshold_zero_is_bit_identical_and_a_high_one_skips(path, uncached, backend):
    base, base_metrics = uncached
    pipeline = cached(path, backend, 0.0)
    assert pipeline.accelerations == [backend]
    arr, metrics = run(pipeline)
    assert np.array_equal(arr, base) and metrics == base_metrics and metrics["num_forwards_skipped"] == 0

    arr, metrics = run(cached(path, backend, 100.0))
    assert metrics["num_forwards_computed"] + metrics["num_forwards_skipped"] == base_metrics["num_forwards_computed"]
    assert metrics["num_forwards_skipped"] > 0 and not np.array_equal(arr, base)


def test_first_block_cache_alone_equals_batched_at_other_steps(path):
    pipeline = cached(path, "first_block_cache", 0.3)
    requests = [request_for(call_kwargs(prompt=BATCH_PROMPTS[i]), seed=BATCH_SEEDS[i], request_id=f"r{i}")
                for i in range(2)]
    alone = []
    for request in requests:
        (state,) = pipeline.denoise([request])
        alone.append((pipeline.decode_arrays([state])[0], pipeline.state_metrics(state)))
    splits_before = pipeline.step_cache.num_split_calls

    # The second request joins after one step: later calls mix requests at different steps.
    states = pipeline.encode([pipeline.prepare_request(requests[0])])
    pipeline.denoise_step(states)
    states += pipeline.encode([pipeline.prepare_request(requests[1])])
    while any(not s.is_done for s in states):
        pipeline.denoise_step([s for s in states if not s.is_done])
    batched = [(arr, pipeline.state_metrics(s)) for s, arr in zip(states, pipeline.decode_arrays(states))]

    assert pipeline.step_cache.num_split_calls > splits_before  # some calls had to split
    for (arr, metrics), (arr_alone, metrics_alone) in zip(batched, alone):
        assert metrics == metrics_alone and metrics["num_forwards_skipped"] > 0
        assert np.abs(arr - arr_alone).max() <= 1e-3


@pytest.mark.parametrize("fields, message", [
    (dict(executor="mp", num_devices=2, ulysses_degree=2),
     r"ulysses_degree=2: HunyuanVideo15Pipeline cannot take it"),
    (dict(lora_adapters={"style": "style.safetensors"}), r"lora_adapters=.*: HunyuanVideo15Pipeline cannot take it"),
])
def test_what_it_cannot_take_is_refused_by_name(path, fields, message):
    with pytest.raises(ValueError, match=message):
        load(path, **fields)
