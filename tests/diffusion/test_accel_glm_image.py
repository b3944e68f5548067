"""GLM-Image's DiT stage with the accelerations: the first-block cache and cache-dit work (threshold 0 is
the plain output bit for bit, a high one skips forwards, a request's result is the same alone
and joining a running batch, to float rounding), and what it cannot take is refused naming
the field and the family."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.models.glm_image.pipeline import GlmImage
from omnistage.testing import call_kwargs as zoo_call_kwargs

from parity import run_staggered
from test_parity_glm_image import dit_request as request
from test_parity_glm_image import prior_tokens

CALL = dict(zoo_call_kwargs("glm-image"), num_inference_steps=6, prior_token_ids=prior_tokens(0))


def load(path, **deploy) -> GlmImage:
    return GlmImage.from_pretrained(str(path), deploy=StageDeployConfig(**deploy))


def run(pipeline: GlmImage, seed: int = 3, **overrides):
    (state,) = pipeline.denoise([request(dict(CALL, **overrides), seed)])
    (arr,) = pipeline.decode_arrays([state])
    return arr, pipeline.state_metrics(state)


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("glm-image")


@pytest.fixture(scope="module")
def plain(path):
    return run(load(path))


def test_first_block_cache_threshold_zero_is_exact_and_a_high_one_skips(path, plain):
    base, base_metrics = plain
    cached = load(path, cache_backend="first_block_cache", cache_config={"threshold": 0.0})
    assert cached.accelerations == ["first_block_cache"]
    arr, metrics = run(cached)
    assert np.array_equal(arr, base) and metrics == base_metrics

    skipping = load(path, cache_backend="first_block_cache", cache_config={"threshold": 100.0})
    arr, metrics = run(skipping)
    assert metrics["num_forwards_skipped"] > 0
    assert metrics["num_forwards_computed"] + metrics["num_forwards_skipped"] == base_metrics["num_forwards_computed"]
    assert not np.array_equal(arr, base)

    # Step mode: a request that joins a running one gets the result it gets alone.
    alone, _ = run(skipping, seed=5, prompt="a tree", num_inference_steps=3)
    long_req = request(CALL, 3, "long")
    short_req = request(dict(CALL, prompt="a tree", num_inference_steps=3), 5, "short")
    long_arr, short_arr = run_staggered(skipping, long_req, short_req, join_after=2)
    # (batched matmuls differ in the last float bits; a different skip decision would be far off)
    assert np.abs(short_arr - alone).max() <= 1e-5 and np.abs(long_arr - arr).max() <= 1e-5


def test_tea_cache_is_refused_by_name(path):
    with pytest.raises(ValueError, match="tea_cache.*GlmImagePipeline"):
        load(path, cache_backend="tea_cache", cache_config={"rel_l1_thresh": 0.2})


def test_cache_dit_dbcache_skips_and_starts_fresh_per_request(path, plain):
    pytest.importorskip("cache_dit")
    base, base_metrics = plain

    def cached(threshold: float) -> GlmImage:
        return load(path, cache_backend="cache_dit", max_num_seqs=1,
                    cache_config={"max_warmup_steps": 1, "residual_diff_threshold": threshold})

    arr, metrics = run(cached(0.0))
    assert np.array_equal(arr, base) and metrics == base_metrics
    pipeline = cached(100.0)
    first, first_metrics = run(pipeline)
    assert first_metrics["num_forwards_skipped"] > 0
    second, second_metrics = run(pipeline)
    assert np.array_equal(second, first) and second_metrics == first_metrics
