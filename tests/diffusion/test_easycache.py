"""cache_backend: easycache on the tiny zoo checkpoints: threshold 0 is the uncached output bit
for bit; a positive threshold skips forwards and stays close to the uncached output; a
request's output and skip count are the same alone or batched with a request at another step;
bad settings and families that do not declare it are refused by name.

Not tested here: CFG parallel on two ranks (a rank spawn costs ~10 s, over this file's budget);
the cache wraps the guidance function CFG parallel installs, as TeaCache does."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.accel import check_family, check_supported
from omnistage.diffusion.registry import pipeline_class

from parity import BATCH_PROMPTS, BATCH_SEEDS, request_for
from test_step_cache import FAMILIES, alone_and_staggered, call_kwargs, psnr, run

STEPS = 12


def load(zoo, name: str, **cache_config):
    deploy = StageDeployConfig(cache_backend="easycache" if cache_config else None, cache_config=cache_config)
    return pipeline_class(FAMILIES[name]).from_pretrained(str(zoo(name)), deploy=deploy)


def test_threshold_zero_is_plain_and_a_positive_one_skips_close_to_plain(zoo):
    plain, plain_metrics = run(load(zoo, "qwen-image"), "qwen-image", num_inference_steps=STEPS)
    assert plain_metrics == {"num_forwards_computed": 2 * STEPS, "num_forwards_skipped": 0}  # cond + uncond

    zero = load(zoo, "qwen-image", threshold=0.0, warmup_steps=0)
    assert zero.accelerations == ["easycache"]
    arr, metrics = run(zero, "qwen-image", num_inference_steps=STEPS)
    assert np.array_equal(arr, plain) and metrics == plain_metrics

    arr, metrics = run(load(zoo, "qwen-image", threshold=0.1, warmup_steps=2), "qwen-image",
                       num_inference_steps=STEPS)
    assert metrics["num_forwards_computed"] + metrics["num_forwards_skipped"] == 2 * STEPS
    # Steps 0, 1 (warm-up) and 11 (last) compute in both branches; 12 of 24 forwards skip (measured).
    assert metrics["num_forwards_skipped"] >= 8
    assert psnr(arr, plain) >= 60.0  # 76.7 dB measured; random weights, so this shows the mechanics only


def test_alone_equals_batched_at_other_steps(zoo):
    """Z-Image runs cond and uncond rows in one call, each padded to the batch's longest prompt."""
    pipeline = load(zoo, "z-image", threshold=0.2, warmup_steps=1)
    requests = [request_for(call_kwargs("z-image", prompt=BATCH_PROMPTS[i], num_inference_steps=STEPS),
                            seed=BATCH_SEEDS[i], request_id=f"r{i}") for i in range(2)]
    # The second request joins after two steps: every later call mixes requests at different steps.
    alone, staggered, splits = alone_and_staggered(pipeline, requests, join_after=2)
    assert splits > 0  # the two requests decided differently on some step
    for (arr, metrics), (arr_alone, metrics_alone) in zip(staggered, alone):
        assert metrics == metrics_alone and metrics_alone["num_forwards_skipped"] > 0
        assert np.abs(arr - arr_alone).max() <= 1e-3


@pytest.mark.parametrize(("config", "message"), [
    ({"threshold": -0.1}, r"cache_config\.threshold: must be >= 0"),
    ({"warmup_steps": 1.5}, r"cache_config\.warmup_steps: must be an int"),
    ({"rel_l1_thresh": 0.1}, r"cache_config\.rel_l1_thresh: not an option of cache_backend 'easycache'"),
])
def test_bad_settings_are_refused_before_loading(config, message):
    with pytest.raises(ValueError, match=message):
        check_supported("0", StageDeployConfig(cache_backend="easycache", cache_config=config))


@pytest.mark.parametrize("family", ["StableDiffusionXLPipeline", "WanVACEPipeline", "LTX2Pipeline"])
def test_families_without_it_refuse_it_by_name(family):
    with pytest.raises(ValueError, match=f"cache_backend='easycache': {family} cannot take it"):
        check_family("0", StageDeployConfig(cache_backend="easycache"), pipeline_class(family))
