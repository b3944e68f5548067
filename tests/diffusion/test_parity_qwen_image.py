"""Qwen-Image: our pipeline against diffusers' QwenImagePipeline on the tiny zoo model (fp32, CPU)."""

from __future__ import annotations

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
from omnistage.diffusion.pipelines.qwen_image import QwenImage
from omnistage.testing.diffusion_models import DEFAULT_CALL_KWARGS

NAME = "qwen-image"
CALL = DEFAULT_CALL_KWARGS[NAME]


@pytest.fixture(scope="module")
def path(zoo):
    return zoo(NAME)


@pytest.fixture(scope="module")
def reference(path):
    from diffusers import QwenImagePipeline

    return load_reference(QwenImagePipeline, path)


@pytest.fixture(scope="module")
def ours(path):
    return QwenImage.from_pretrained(path)


def test_registered_as_native():
    assert pipeline_class("QwenImagePipeline") is QwenImage


def test_alone_matches_diffusers(ours, reference):
    assert CALL["true_cfg_scale"] > 1 and CALL["negative_prompt"]  # true CFG is on
    expected = reference_arrays(reference, CALL, seed=0)
    (got,) = run_arrays(ours, [request_for(CALL, seed=0)])
    assert max_abs_diff(got, expected) <= TOLERANCE


def test_batch_matches_each_alone(ours, reference):
    # Different prompt lengths: the batch pads the prompt embeddings and masks the padding.
    calls = [dict(CALL, prompt=p) for p in BATCH_PROMPTS]
    expected = [reference_arrays(reference, c, s) for c, s in zip(calls, BATCH_SEEDS)]
    got = run_arrays(ours, [request_for(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, BATCH_SEEDS))])
    for g, e in zip(got, expected):
        assert max_abs_diff(g, e) <= TOLERANCE


def test_batch_mixes_cfg_scales_sizes_and_outputs(ours, reference):
    calls = [
        dict(CALL, prompt=BATCH_PROMPTS[0], negative_prompt=None),  # no negative prompt: CFG off
        dict(CALL, prompt=BATCH_PROMPTS[1], true_cfg_scale=3.0, num_images_per_prompt=2),
        dict(CALL, prompt=BATCH_PROMPTS[2], height=32, width=64, max_sequence_length=8),  # its own group
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


def test_default_size_comes_from_the_checkpoint(ours):
    params = ours.prepare_params(DiffusionParams())
    assert params.height == params.width == ours.default_sample_size * ours.vae_scale_factor
    assert params.num_inference_steps == 50 and params.true_cfg_scale == 4.0


def test_unknown_extra_is_rejected(ours):
    request = DiffusionRequest("r", "a cat", DiffusionParams(extras={"cfg_truncation": 0.5}))
    with pytest.raises(ValueError, match="cfg_truncation"):
        ours.encode([request])


def test_max_sequence_length_is_bounded(ours):
    request = DiffusionRequest("r", "a cat", DiffusionParams(extras={"max_sequence_length": 2048}))
    with pytest.raises(ValueError, match="max_sequence_length"):
        ours.encode([request])


def test_guidance_scale_needs_a_distilled_model(ours):
    assert not ours.transformer.config.guidance_embeds
    request = DiffusionRequest("r", "a cat", DiffusionParams(guidance_scale=3.5, height=64, width=64))
    with pytest.raises(ValueError, match="guidance_scale"):
        ours.encode([request])


def test_size_not_divisible_is_rejected(ours):
    request = DiffusionRequest("r", "a cat", DiffusionParams(height=64, width=72))
    with pytest.raises(ValueError, match="width"):
        ours.encode([request])
