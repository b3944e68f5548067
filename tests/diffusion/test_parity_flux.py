"""FLUX.1: our pipeline against diffusers' FluxPipeline on the tiny zoo model (fp32, CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

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
from omnistage.diffusion.pipelines.flux import Flux
from omnistage.testing.diffusion_models import DEFAULT_CALL_KWARGS

NAME = "flux"
CALL = DEFAULT_CALL_KWARGS[NAME]


@pytest.fixture(scope="module")
def path(zoo):
    return zoo(NAME)


@pytest.fixture(scope="module")
def reference(path):
    from diffusers import FluxPipeline

    return load_reference(FluxPipeline, path)


@pytest.fixture(scope="module")
def ours(path):
    return Flux.from_pretrained(path)


def test_registered_as_native():
    assert pipeline_class("FluxPipeline") is Flux


def test_the_zoo_model_uses_the_guidance_embedding(ours):
    # The guidance-embedding path is the one FLUX.1-dev takes; make sure the tests cover it.
    assert ours.transformer.config.guidance_embeds


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
    assert max_abs_diff(got[0], got[1]) > 1e-2  # different prompts and seeds: really different images


def test_batch_mixes_true_cfg_guidance_sizes_and_outputs(ours, reference):
    # True CFG adds an uncond pass for one request only; another size forms its own group.
    calls = [
        dict(CALL, prompt=BATCH_PROMPTS[0], true_cfg_scale=2.5),
        dict(CALL, prompt=BATCH_PROMPTS[1], guidance_scale=1.5, num_images_per_prompt=2),
        dict(CALL, prompt=BATCH_PROMPTS[2], height=32, width=64, max_sequence_length=32),
    ]
    expected = [reference_arrays(reference, c, s) for c, s in zip(calls, BATCH_SEEDS)]
    got = run_arrays(ours, [request_for(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, BATCH_SEEDS))])
    for g, e in zip(got, expected):
        assert max_abs_diff(g, e) <= TOLERANCE


def test_staggered_requests_share_steps(ours, reference):
    long_call = dict(CALL, prompt=BATCH_PROMPTS[0], num_inference_steps=4)
    short_call = dict(CALL, prompt=BATCH_PROMPTS[1], num_inference_steps=2, true_cfg_scale=2.0)
    expected = [reference_arrays(reference, long_call, 1), reference_arrays(reference, short_call, 2)]
    got = run_staggered(ours, request_for(long_call, 1, "long"), request_for(short_call, 2, "short"), join_after=2)
    for g, e in zip(got, expected):
        assert max_abs_diff(g, e) <= TOLERANCE


def test_forward_returns_the_decoded_images(ours, reference):
    # The payload is the float output in uint8: within one level of rounding.
    expected = reference_arrays(reference, CALL, seed=5)[0]
    (payload,) = ours.forward([request_for(CALL, seed=5)])
    got = np.asarray(payload.images[0], dtype=np.float64) / 255
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 1 / 255 + 1e-6


def test_defaults_come_from_the_checkpoint(ours):
    # FluxPipeline: 128 latent pixels times the VAE's downsampling factor.
    side = 128 * 2 ** (len(ours.vae.config.block_out_channels) - 1)
    params = ours.prepare_params(DiffusionParams())
    assert (params.height, params.width, params.num_inference_steps, params.guidance_scale) == (side, side, 28, 3.5)
    assert params.extras == {"max_sequence_length": 512}


@pytest.mark.parametrize("field, params", [
    ("height", DiffusionParams(height=40, width=64)),
    ("width", DiffusionParams(height=64, width=72)),
    ("max_sequence_length", DiffusionParams(height=64, width=64, extras={"max_sequence_length": 513})),
])
def test_bad_inputs_are_rejected(ours, field, params):
    with pytest.raises(ValueError, match=field):
        ours.encode([DiffusionRequest("r", "a cat", params)])


def test_input_image_is_rejected(ours):
    from omnistage.testing.diffusion_models import default_input_image

    request = DiffusionRequest("r", "a cat", DiffusionParams(height=64, width=64), images=[default_input_image()])
    with pytest.raises(ValueError, match="image"):
        ours.encode([request])
