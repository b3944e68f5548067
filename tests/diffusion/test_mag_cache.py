"""cache_backend: mag_cache on the tiny zoo checkpoints: threshold 0 is the uncached output bit
for bit; with any error allowed, the skips follow `warmup_steps` and `max_skip_steps` exactly;
a small threshold skips some forwards and stays close to the uncached output; a request's
output and skip count are the same alone or batched with a request at another step; bad
settings are refused by name.

On two ranks (CFG parallel, Ulysses): test_declared_accelerations.py, in the spawn it already
makes (`CACHED_PARALLEL`): the ranks skip what one rank skips and give its output."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.accel import check_supported
from omnistage.diffusion.registry import pipeline_class

from parity import BATCH_PROMPTS, BATCH_SEEDS, request_for
from test_step_cache import FAMILIES, alone_and_staggered, call_kwargs, psnr, run

STEPS = 12


def load(zoo, name: str, **cache_config):
    deploy = StageDeployConfig(cache_backend="mag_cache" if cache_config else None, cache_config=cache_config)
    return pipeline_class(FAMILIES[name]).from_pretrained(str(zoo(name)), deploy=deploy)


def test_threshold_zero_is_plain_and_the_skips_follow_the_ratio(zoo):
    plain, plain_metrics = run(load(zoo, "qwen-image"), "qwen-image", num_inference_steps=STEPS)
    zero = load(zoo, "qwen-image", threshold=0.0, warmup_steps=0)
    assert zero.accelerations == ["mag_cache"]
    arr, metrics = run(zero, "qwen-image", num_inference_steps=STEPS)
    assert np.array_equal(arr, plain) and metrics == plain_metrics

    # Any error allowed: steps 0-1 warm up, then runs of max_skip_steps skips, each followed by a
    # computed step, and the last step computes; per branch (cond, uncond).
    for max_skip, skipped in ((1, 5), (4, 8)):  # skip 2,4,6,8,10 | skip 2-5 and 7-10
        _, metrics = run(load(zoo, "qwen-image", threshold=100.0, warmup_steps=2, max_skip_steps=max_skip),
                         "qwen-image", num_inference_steps=STEPS)
        assert metrics == {"num_forwards_computed": 2 * (STEPS - skipped), "num_forwards_skipped": 2 * skipped}

    arr, metrics = run(load(zoo, "qwen-image", threshold=0.1, warmup_steps=2), "qwen-image",
                       num_inference_steps=STEPS)
    assert 0 < metrics["num_forwards_skipped"] < 16  # the measured ratio, not max_skip_steps, stops it
    assert psnr(arr, plain) >= 50.0  # random weights: this shows the mechanics only


def test_alone_equals_batched_at_other_steps(zoo):
    """Z-Image runs cond and uncond rows in one call, each padded to the batch's longest prompt."""
    pipeline = load(zoo, "z-image", threshold=0.3, warmup_steps=1)
    requests = [request_for(call_kwargs("z-image", prompt=BATCH_PROMPTS[i], num_inference_steps=STEPS),
                            seed=BATCH_SEEDS[i], request_id=f"r{i}") for i in range(2)]
    # The second request joins after two steps: every later call mixes requests at different steps.
    alone, staggered, _ = alone_and_staggered(pipeline, requests, join_after=2)
    for (arr, metrics), (arr_alone, metrics_alone) in zip(staggered, alone):
        assert metrics == metrics_alone and metrics_alone["num_forwards_skipped"] > 0
        assert np.abs(arr - arr_alone).max() <= 1e-3


@pytest.mark.parametrize(("config", "message"), [
    ({"threshold": -0.1}, r"cache_config\.threshold: must be >= 0"),
    ({"max_skip_steps": 0}, r"cache_config\.max_skip_steps: must be >= 1"),
    ({"rel_l1_thresh": 0.1}, r"cache_config\.rel_l1_thresh: not an option of cache_backend 'mag_cache'"),
])
def test_bad_settings_are_refused_before_loading(config, message):
    with pytest.raises(ValueError, match=message):
        check_supported("0", StageDeployConfig(cache_backend="mag_cache", cache_config=config))
