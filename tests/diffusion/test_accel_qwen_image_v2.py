"""Accelerations on Qwen-Image-Edit-Plus and Qwen-Image 2.1 (tiny zoo models).

Edit-Plus is Qwen-Image's transformer, so the step caches hook its blocks as they do the
edit model's. 2.1 keeps a prefix KV cache per request and branch: the step caches and
sequence parallel are refused by name at load (VAE patch parallel refuses its VAE class by
name too: it is written for the native families' VAEs). That its CFG parallel (each rank runs
one branch, so each fills and reads its own branch's cache) equals one rank, with one branch's
forwards per rank, test_declared_accelerations.py checks.
"""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.models.qwen_image.edit_plus_pipeline import QwenImageEditPlus
from omnistage.models.qwen_image.v21_pipeline import QwenImage21
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image
from omnistage.testing.qwen_image21_models import NAME as V21
from omnistage.testing.qwen_image_edit_plus_models import NAME as PLUS

from parity import request_for

pytestmark = pytest.mark.slow


def run(pipeline, call: dict, seed: int = 3):
    """(float output, metrics) of one request run alone."""
    (state,) = pipeline.denoise([request_for(call, seed)])
    (arr,) = pipeline.decode_arrays([state])
    return arr, pipeline.state_metrics(state)


def test_edit_plus_first_block_cache(zoo):
    path = str(zoo(PLUS))
    call = dict(zoo_call_kwargs(PLUS), num_inference_steps=5, image=[default_input_image()])
    base, base_metrics = run(QwenImageEditPlus.from_pretrained(path), call)

    def cached(threshold: float):
        deploy = StageDeployConfig(cache_backend="first_block_cache", cache_config={"threshold": threshold})
        pipeline = QwenImageEditPlus.from_pretrained(path, deploy=deploy)
        assert pipeline.accelerations == ["first_block_cache"]
        return run(pipeline, call)

    arr, metrics = cached(0.0)
    assert np.array_equal(arr, base) and metrics == base_metrics and metrics["num_forwards_skipped"] == 0
    arr, metrics = cached(100.0)
    assert metrics["num_forwards_skipped"] > 0
    assert metrics["num_forwards_computed"] + metrics["num_forwards_skipped"] == base_metrics["num_forwards_computed"]


@pytest.mark.parametrize("fields, message", [
    (dict(cache_backend="first_block_cache"), "cache_backend"),
    (dict(cache_backend="tea_cache"), "cache_backend"),
    (dict(executor="mp", num_devices=2, ulysses_degree=2),
     r"ulysses_degree=2: QwenImage21Pipeline cannot take it"),
])
def test_v21_refuses_by_name(zoo, fields, message):
    with pytest.raises(ValueError, match=message):
        QwenImage21.from_pretrained(str(zoo(V21)), deploy=StageDeployConfig(**fields))
