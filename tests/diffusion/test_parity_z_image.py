"""Z-Image: our pipeline against diffusers' ZImagePipeline on the tiny zoo model (fp32, CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from parity import (
    BATCH_PROMPTS,
    BATCH_SEEDS,
    TOLERANCE,
    load_reference,
    max_abs_diff,
    reference_arrays,
    request_for,
    run_arrays,
    run_staggered,
)

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.pipelines import pipeline_class
from omnistage.diffusion.pipelines.base import DiffusionRequest
from omnistage.diffusion.pipelines.z_image import ZImage
from omnistage.testing.diffusion_models import DEFAULT_CALL_KWARGS

NAME = "z-image"
CALL = DEFAULT_CALL_KWARGS[NAME]


@pytest.fixture(scope="module")
def path(zoo):
    return zoo(NAME)


@pytest.fixture(scope="module")
def reference(path):
    from diffusers import ZImagePipeline

    return load_reference(ZImagePipeline, path)


@pytest.fixture(scope="module")
def ours(path):
    return ZImage.from_pretrained(path)


def test_registered_as_native():
    assert pipeline_class("ZImagePipeline") is ZImage


def test_alone_matches_diffusers(ours, reference):
    expected = reference_arrays(reference, CALL, seed=0)
    (got,) = run_arrays(ours, [request_for(CALL, seed=0)])
    assert max_abs_diff(got, expected) <= TOLERANCE


def test_batch_matches_each_alone(ours, reference):
    calls = [dict(CALL, prompt=p) for p in BATCH_PROMPTS]
    expected = [reference_arrays(reference, c, s) for c, s in zip(calls, BATCH_SEEDS)]
    got = run_arrays(ours, [request_for(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, BATCH_SEEDS))])
    for g, e in zip(got, expected):
        assert max_abs_diff(g, e) <= TOLERANCE


def test_forward_returns_the_decoded_images(ours, reference):
    # The payload is the float output in uint8: within one level of rounding.
    expected = reference_arrays(reference, CALL, seed=5)[0]
    (payload,) = ours.forward([request_for(CALL, seed=5)])
    got = np.asarray(payload.images[0], dtype=np.float64) / 255
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 1 / 255 + 1e-6


def test_batch_mixes_sizes_guidance_and_outputs(ours, reference):
    # The transformer pads a list of latents itself, so one call mixes image sizes, CFG on/off
    # and several outputs per prompt.
    calls = [
        dict(CALL, prompt=BATCH_PROMPTS[0], height=32, width=64),
        dict(CALL, prompt=BATCH_PROMPTS[1], guidance_scale=0.0),
        dict(CALL, prompt=BATCH_PROMPTS[2], num_images_per_prompt=2, cfg_normalization=1.0, cfg_truncation=0.5),
    ]
    expected = [reference_arrays(reference, c, s) for c, s in zip(calls, BATCH_SEEDS)]
    got = run_arrays(ours, [request_for(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, BATCH_SEEDS))])
    for g, e in zip(got, expected):
        assert max_abs_diff(g, e) <= TOLERANCE


def test_staggered_requests_share_steps(ours, reference):
    long_call = dict(CALL, prompt=BATCH_PROMPTS[0], num_inference_steps=4)
    short_call = dict(CALL, prompt=BATCH_PROMPTS[1], num_inference_steps=2)
    expected = [reference_arrays(reference, long_call, 1), reference_arrays(reference, short_call, 2)]
    got = run_staggered(ours, request_for(long_call, 1, "long"), request_for(short_call, 2, "short"), join_after=2)
    for g, e in zip(got, expected):
        assert max_abs_diff(g, e) <= TOLERANCE


def test_unknown_extra_is_rejected(ours):
    request = DiffusionRequest("r", "a cat", DiffusionParams(extras={"strength": 0.5}))
    with pytest.raises(ValueError, match="strength"):
        ours.encode([request])


def test_extra_out_of_range_is_rejected(ours):
    request = DiffusionRequest("r", "a cat", DiffusionParams(extras={"cfg_truncation": -1.0}))
    with pytest.raises(ValueError, match="cfg_truncation"):
        ours.encode([request])


def test_size_not_divisible_is_rejected(ours):
    request = DiffusionRequest("r", "a cat", DiffusionParams(height=40, width=64))
    with pytest.raises(ValueError, match="height"):
        ours.encode([request])


def test_input_image_is_rejected(ours):
    from omnistage.testing.diffusion_models import default_input_image

    request = DiffusionRequest("r", "a cat", DiffusionParams(), images=[default_input_image()])
    with pytest.raises(ValueError, match="image"):
        ours.encode([request])
