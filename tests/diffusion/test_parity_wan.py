"""Wan: our WanT2V / WanI2V against diffusers' WanPipeline / WanImageToVideoPipeline on the
tiny zoo models (fp32, CPU), plus the checkpoint-driven Wan 2.2 variants (two experts split
by boundary_ratio; expand_timesteps) built here from the zoo components."""

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
from omnistage.diffusion.pipelines.wan import WanI2V, WanT2V
from omnistage.engine.types import VideoPayload
from omnistage.testing.diffusion_models import DEFAULT_CALL_KWARGS, default_input_image

T2V_CALL = DEFAULT_CALL_KWARGS["wan-t2v"]
I2V_CALL = dict(DEFAULT_CALL_KWARGS["wan-i2v"], image=default_input_image(DEFAULT_CALL_KWARGS["wan-i2v"]["height"]))
# Wan 2.2 A14B's T2V value; with the zoo's 4-step schedule (999, 900, 750, 500) the
# first two steps run on `transformer`, the last two on `transformer_2`.
BOUNDARY_RATIO = 0.875


def expect_each(reference, calls, seeds):
    return [reference_arrays(reference, c, s) for c, s in zip(calls, seeds)]


def run_batch(ours, calls, seeds):
    return run_arrays(ours, [request_for(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, seeds))])


def assert_all_close(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert max_abs_diff(g, e) <= TOLERANCE


# -- models -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def t2v_path(zoo):
    return zoo("wan-t2v")


@pytest.fixture(scope="module")
def t2v_reference(t2v_path):
    from diffusers import WanPipeline

    return load_reference(WanPipeline, t2v_path)


@pytest.fixture(scope="module")
def t2v(t2v_path):
    return WanT2V.from_pretrained(t2v_path)


@pytest.fixture(scope="module")
def i2v_path(zoo):
    return zoo("wan-i2v")


def load_i2v_reference(path):
    # Unlike WanPipeline, diffusers' WanImageToVideoPipeline cleans prompts with ftfy
    # unconditionally (our WanI2V uses the ftfy-optional cleaner WanPipeline uses).
    pytest.importorskip("ftfy", reason="diffusers' WanImageToVideoPipeline needs ftfy")
    from diffusers import WanImageToVideoPipeline

    return load_reference(WanImageToVideoPipeline, path)


@pytest.fixture(scope="module")
def i2v_reference(i2v_path):
    return load_i2v_reference(i2v_path)


@pytest.fixture(scope="module")
def i2v(i2v_path):
    return WanI2V.from_pretrained(i2v_path)


@pytest.fixture(scope="module")
def two_expert_path(t2v_reference, tmp_path_factory):
    """A Wan 2.2 A14B-style checkpoint: the zoo T2V plus a perturbed copy as the low-noise expert."""
    import copy

    from diffusers import WanPipeline

    transformer_2 = copy.deepcopy(t2v_reference.transformer)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in transformer_2.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    components = dict(t2v_reference.components, transformer_2=transformer_2)
    out = tmp_path_factory.mktemp("wan-two-experts")
    WanPipeline(**components, boundary_ratio=BOUNDARY_RATIO).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def ti2v_path(t2v_reference, tmp_path_factory):
    """A Wan 2.2 TI2V-style I2V checkpoint: no image encoder, expand_timesteps, the image
    pinned as the first latent frame (the zoo T2V's 16-channel transformer fits)."""
    from diffusers import WanImageToVideoPipeline

    components = {k: v for k, v in t2v_reference.components.items() if k != "transformer_2"}
    out = tmp_path_factory.mktemp("wan-ti2v")
    WanImageToVideoPipeline(**components, expand_timesteps=True).save_pretrained(out)
    return out


def test_registered_as_native():
    assert pipeline_class("WanPipeline") is WanT2V
    assert pipeline_class("WanImageToVideoPipeline") is WanI2V


# -- text to video --------------------------------------------------------------------------


def test_t2v_alone_matches_diffusers(t2v, t2v_reference):
    expected = reference_arrays(t2v_reference, T2V_CALL, seed=0)
    states = t2v.denoise([request_for(T2V_CALL, seed=0)])
    (got,) = t2v.decode_arrays(states)
    assert got.shape == (T2V_CALL["num_frames"], T2V_CALL["height"], T2V_CALL["width"], 3)
    assert max_abs_diff(got, expected) <= TOLERANCE
    # The payload is the same video in uint8 (within one level of rounding) at the default fps.
    (payload,) = t2v.decode(states)
    assert isinstance(payload, VideoPayload) and payload.fps == 16.0
    assert payload.frames.dtype == np.uint8 and payload.frames.shape == expected.shape
    assert np.abs(payload.frames / 255 - expected).max() <= 1 / 255 + 1e-6


def test_t2v_batch_matches_each_alone(t2v, t2v_reference):
    # Different prompts and seeds in one call; CFG off for one, another negative prompt for one.
    calls = [
        dict(T2V_CALL, prompt=BATCH_PROMPTS[0]),
        dict(T2V_CALL, prompt=BATCH_PROMPTS[1], guidance_scale=1.0),
        dict(T2V_CALL, prompt=BATCH_PROMPTS[2], negative_prompt="a dog", guidance_scale=3.0),
    ]
    got = run_batch(t2v, calls, BATCH_SEEDS)
    assert_all_close(got, expect_each(t2v_reference, calls, BATCH_SEEDS))
    assert max_abs_diff(got[0], got[1]) > 1e-2  # different prompts and seeds: really different videos


def test_t2v_staggered_requests_share_steps(t2v, t2v_reference):
    long_call = dict(T2V_CALL, prompt=BATCH_PROMPTS[0], num_inference_steps=4)
    short_call = dict(T2V_CALL, prompt=BATCH_PROMPTS[1], num_inference_steps=2)
    expected = [reference_arrays(t2v_reference, long_call, 1), reference_arrays(t2v_reference, short_call, 2)]
    got = run_staggered(t2v, request_for(long_call, 1, "long"), request_for(short_call, 2, "short"), join_after=2)
    assert_all_close(got, expected)


# -- image to video -------------------------------------------------------------------------


def test_i2v_alone_matches_diffusers(i2v, i2v_reference):
    expected = reference_arrays(i2v_reference, I2V_CALL, seed=0)
    (got,) = run_arrays(i2v, [request_for(I2V_CALL, seed=0)])
    assert max_abs_diff(got, expected) <= TOLERANCE


def test_i2v_batch_matches_each_alone(i2v, i2v_reference):
    # Different images, prompts and seeds; fewer frames and a shorter prompt window for one
    # (its own group), CFG off for another.
    from PIL import Image

    image = I2V_CALL["image"]
    calls = [
        dict(I2V_CALL, prompt=BATCH_PROMPTS[0]),
        dict(I2V_CALL, prompt=BATCH_PROMPTS[1], image=image.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
             num_frames=5, max_sequence_length=16),
        dict(I2V_CALL, prompt=BATCH_PROMPTS[2], image=image.rotate(90), guidance_scale=1.0),
    ]
    assert_all_close(run_batch(i2v, calls, BATCH_SEEDS), expect_each(i2v_reference, calls, BATCH_SEEDS))


def test_i2v_staggered_requests_share_steps(i2v, i2v_reference):
    long_call = dict(I2V_CALL, prompt=BATCH_PROMPTS[0], num_inference_steps=4)
    short_call = dict(I2V_CALL, prompt=BATCH_PROMPTS[1], num_inference_steps=2, guidance_scale=1.0)
    expected = [reference_arrays(i2v_reference, long_call, 1), reference_arrays(i2v_reference, short_call, 2)]
    got = run_staggered(i2v, request_for(long_call, 1, "long"), request_for(short_call, 2, "short"), join_after=2)
    assert_all_close(got, expected)


# -- Wan 2.2 variants (checkpoint-driven) ---------------------------------------------------


def test_two_experts_switch_at_the_boundary(two_expert_path):
    from diffusers import WanPipeline

    reference = load_reference(WanPipeline, two_expert_path)
    ours = WanT2V.from_pretrained(two_expert_path)
    assert ours.boundary_ratio == BOUNDARY_RATIO and ours.transformer_2 is not None
    # Staggered: when the 2-step request joins, the 4-step one is on the second expert
    # (t=750, its own guidance_scale_2) and the newcomer on the first (t=999): one
    # denoise_step call runs both experts.
    long_call = dict(T2V_CALL, prompt=BATCH_PROMPTS[0], num_inference_steps=4, guidance_scale_2=2.0)
    short_call = dict(T2V_CALL, prompt=BATCH_PROMPTS[1], num_inference_steps=2)
    expected = [reference_arrays(reference, long_call, 1), reference_arrays(reference, short_call, 2)]
    got = run_staggered(ours, request_for(long_call, 1, "long"), request_for(short_call, 2, "short"), join_after=2)
    assert_all_close(got, expected)


def test_expand_timesteps_pins_the_first_frame(ti2v_path):
    reference = load_i2v_reference(ti2v_path)
    ours = WanI2V.from_pretrained(ti2v_path)
    assert ours.expand_timesteps and ours.image_encoder is None
    calls = [I2V_CALL, dict(I2V_CALL, prompt=BATCH_PROMPTS[1], image=I2V_CALL["image"].rotate(90))]
    expected = expect_each(reference, calls, BATCH_SEEDS[:2])
    assert_all_close(run_batch(ours, calls, BATCH_SEEDS[:2]), expected)


# -- input checks ---------------------------------------------------------------------------


def small(**fields) -> DiffusionParams:
    return DiffusionParams(**{"height": 64, "width": 64, "num_frames": 9, **fields})


@pytest.mark.parametrize("field, params", [
    ("height", small(height=40)),
    ("width", small(width=72)),
    ("num_frames", small(num_frames=8)),
    ("num_outputs_per_prompt", small(num_outputs_per_prompt=2)),
    ("guidance_scale_2", small(guidance_scale_2=3.0)),  # the zoo model has one expert
])
def test_t2v_bad_inputs_are_rejected(t2v, field, params):
    with pytest.raises(ValueError, match=field):
        t2v.encode([DiffusionRequest("r", "a cat", params)])


def test_t2v_rejects_an_input_image(t2v):
    with pytest.raises(ValueError, match="image"):
        t2v.encode([DiffusionRequest("r", "a cat", small(), images=[default_input_image()])])


def test_i2v_needs_an_input_image(i2v):
    with pytest.raises(ValueError, match="image"):
        i2v.encode([DiffusionRequest("r", "a cat", small())])


def test_i2v_rejects_an_image_that_is_not_pil(i2v):
    with pytest.raises(ValueError, match="image"):
        i2v.encode([DiffusionRequest("r", "a cat", small(), images=[np.zeros((64, 64, 3), np.uint8)])])
