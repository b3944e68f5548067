"""cache_backend: cache_dit: cache-dit's DBCache on our native transformer of every family,
through its public API: threshold 0 is the uncached output bit for bit, a high one skips,
every request starts from a fresh cache context, bad options are refused naming them."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.accel import check_supported
from omnistage.diffusion.registry import pipeline_class

from test_step_cache import FAMILIES, run, load

pytest.importorskip("cache_dit")


def load_cache_dit(zoo, name: str, **options):
    deploy = StageDeployConfig(cache_backend="cache_dit", cache_config={"max_warmup_steps": 1} | options)
    return pipeline_class(FAMILIES[name]).from_pretrained(str(zoo(name)), deploy=deploy)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_dbcache_on_every_family(zoo, name):
    base, base_metrics = run(load(zoo, name), name)
    arr, metrics = run(load_cache_dit(zoo, name, residual_diff_threshold=0.0), name)
    assert np.array_equal(arr, base) and metrics == base_metrics

    pipeline = load_cache_dit(zoo, name, residual_diff_threshold=100.0)
    assert pipeline.accelerations == ["cache_dit"]
    first, first_metrics = run(pipeline, name)
    total = base_metrics["num_forwards_computed"]
    assert first_metrics["num_forwards_skipped"] > 0
    assert first_metrics["num_forwards_computed"] + first_metrics["num_forwards_skipped"] == total
    # The next request gets a fresh context: the same output and counts as the first.
    second, second_metrics = run(pipeline, name)
    assert np.array_equal(second, first) and second_metrics == first_metrics


def test_taylorseer_reaches_cache_dit(zoo):
    """enable_taylorseer hands cache-dit a TaylorSeer calibrator of the order asked. (On the
    tiny random models its output equals plain DBCache's, also with cache-dit applied to the
    transformer directly, so the test checks the configuration, not the pixels.)"""
    import cache_dit

    pipeline = load_cache_dit(zoo, "qwen-image", residual_diff_threshold=0.5, enable_taylorseer=True,
                              taylorseer_order=2)
    _, metrics = run(pipeline, "qwen-image")
    calibrator = cache_dit.summary(pipeline.transformer, logging=False)[0].cache_options["calibrator_config"]
    assert isinstance(calibrator, cache_dit.TaylorSeerCalibratorConfig) and calibrator.taylorseer_order == 2
    assert metrics["num_forwards_skipped"] > 0


@pytest.mark.parametrize(("fields", "message"), [
    ({"cache_config": {"Fn_compute_block": 1}}, r"cache_config\.Fn_compute_block: not an option"),
    ({"cache_config": {"Fn_compute_blocks": 0}}, r"cache_config\.Fn_compute_blocks: must be >= 1"),
    ({"cache_config": {"enable_taylorseer": 1}}, r"cache_config\.enable_taylorseer: must be a bool"),
    ({"max_num_seqs": 2}, "max_num_seqs: cache_backend 'cache_dit' keeps one cache per transformer"),
    ({"max_num_seqs": 1, "executor": "mp", "num_devices": 2, "ulysses_degree": 2},
     "cache_backend=cache_dit cannot be combined with ulysses_degree=2: cache-dit's hooks would see a rank's shard"),
    ({"max_num_seqs": 1, "executor": "mp", "num_devices": 2, "ring_degree": 2},
     "cache_backend=cache_dit cannot be combined with ring_degree=2"),
])
def test_bad_options_are_refused_naming_them(fields, message):
    with pytest.raises(ValueError, match=message):
        check_supported("0", StageDeployConfig(cache_backend="cache_dit", **fields))
