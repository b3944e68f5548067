"""Wan: our WanT2V / WanI2V against diffusers' WanPipeline / WanImageToVideoPipeline on the
tiny zoo models (fp32, CPU), plus the checkpoint-driven Wan 2.2 variants (two experts split
by boundary_ratio; expand_timesteps) built here from the zoo T2V components."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity import BATCH_PROMPTS, BATCH_SEEDS, ParityTests, assert_rejected, load_reference, reference_outputs

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.wan.pipeline import WanI2V, WanT2V
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

# Wan 2.2 A14B's T2V value; with the zoo's 4-step schedule (999, 900, 750, 500) the
# first two steps run on `transformer`, the last two on `transformer_2`.
BOUNDARY_RATIO = 0.875
# The zoo's I2V defaults with an input image of the video's size.
I2V_CALL = dict(zoo_call_kwargs("wan-i2v"), image=default_input_image(zoo_call_kwargs("wan-i2v")["height"]))


def small(**fields) -> DiffusionParams:
    return DiffusionParams(**{"height": 64, "width": 64, "num_frames": 9, **fields})


def load_i2v_reference(path):
    # Unlike WanPipeline, diffusers' WanImageToVideoPipeline cleans prompts with ftfy
    # unconditionally (our WanI2V uses the ftfy-optional cleaner WanPipeline uses); ftfy is a
    # dev dependency.
    from diffusers import WanImageToVideoPipeline

    return load_reference(WanImageToVideoPipeline, path)


class TestWanT2V(ParityTests):
    zoo_name = "wan-t2v"
    reference_class = "WanPipeline"
    pipeline_class = WanT2V

    def batch_calls(self, call):
        # CFG off for one, another negative prompt for one.
        return [
            dict(call, prompt=BATCH_PROMPTS[0]),
            dict(call, prompt=BATCH_PROMPTS[1], guidance_scale=1.0),
            dict(call, prompt=BATCH_PROMPTS[2], negative_prompt="a dog", guidance_scale=3.0),
        ]

    def test_output_is_one_video_at_the_default_fps(self, ours, expected, call):
        assert expected(call, self.alone_seed).shape == (call["num_frames"], call["height"], call["width"], 3)
        assert ours.prepare_params(DiffusionParams()).fps == 16

    # -- Wan 2.2 variants (checkpoint-driven), built from the zoo T2V's components ---------------

    @pytest.fixture(scope="class")
    @classmethod
    def two_expert_path(cls, reference, tmp_path_factory):
        """A Wan 2.2 A14B-style checkpoint: the zoo T2V plus a perturbed copy as the low-noise expert."""
        import copy

        from diffusers import WanPipeline

        transformer_2 = copy.deepcopy(reference.transformer)
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in transformer_2.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=generator))
        components = dict(reference.components, transformer_2=transformer_2)
        out = tmp_path_factory.mktemp("wan-two-experts")
        WanPipeline(**components, boundary_ratio=BOUNDARY_RATIO).save_pretrained(out)
        return out

    @pytest.fixture(scope="class")
    @classmethod
    def ti2v_path(cls, reference, tmp_path_factory):
        """A Wan 2.2 TI2V-style I2V checkpoint: no image encoder, expand_timesteps, the image
        pinned as the first latent frame (the zoo T2V's 16-channel transformer fits)."""
        from diffusers import WanImageToVideoPipeline

        components = {k: v for k, v in reference.components.items() if k != "transformer_2"}
        out = tmp_path_factory.mktemp("wan-ti2v")
        WanImageToVideoPipeline(**components, expand_timesteps=True).save_pretrained(out)
        return out

    def test_two_experts_switch_at_the_boundary(self, two_expert_path, call):
        from diffusers import WanPipeline

        reference = load_reference(WanPipeline, two_expert_path)
        ours = WanT2V.from_pretrained(two_expert_path)
        assert ours.boundary_ratio == BOUNDARY_RATIO and ours.transformer_2 is not None
        # Staggered: when the 2-step request joins, the 4-step one is on the second expert
        # (t=750, its own guidance_scale_2) and the newcomer on the first (t=999): one
        # denoise_step call runs both experts.
        long_call = dict(call, prompt=BATCH_PROMPTS[0], num_inference_steps=4, guidance_scale_2=2.0)
        short_call = dict(call, prompt=BATCH_PROMPTS[1], num_inference_steps=2)
        self.assert_staggered_matches(ours, reference_outputs(reference), long_call, short_call)

    def test_expand_timesteps_pins_the_first_frame(self, ti2v_path):
        reference = load_i2v_reference(ti2v_path)
        ours = WanI2V.from_pretrained(ti2v_path)
        assert ours.expand_timesteps and ours.image_encoder is None
        calls = [I2V_CALL, dict(I2V_CALL, prompt=BATCH_PROMPTS[1], image=I2V_CALL["image"].rotate(90))]
        self.assert_batch_matches(ours, reference_outputs(reference), calls, BATCH_SEEDS[:2])

    # -- input checks ---------------------------------------------------------------------------

    @pytest.mark.parametrize("field, params", [
        ("height", small(height=40)),
        ("width", small(width=72)),
        ("num_frames", small(num_frames=8)),
        ("num_outputs_per_prompt", small(num_outputs_per_prompt=2)),
        ("guidance_scale_2", small(guidance_scale_2=3.0)),  # the zoo model has one expert
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)


class TestWanI2V(ParityTests):
    zoo_name = "wan-i2v"
    reference_class = "WanImageToVideoPipeline"
    pipeline_class = WanI2V
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return I2V_CALL

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        return load_i2v_reference(path)

    def batch_calls(self, call):
        # Different images; fewer frames and a shorter prompt window for one (its own group),
        # CFG off for another.
        from PIL import Image

        image = call["image"]
        return [
            dict(call, prompt=BATCH_PROMPTS[0]),
            dict(call, prompt=BATCH_PROMPTS[1], image=image.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
                 num_frames=5, max_sequence_length=16),
            dict(call, prompt=BATCH_PROMPTS[2], image=image.rotate(90), guidance_scale=1.0),
        ]

    def test_rejects_an_image_that_is_not_pil(self, ours):
        assert_rejected(ours, "image", small(), [np.zeros((64, 64, 3), np.uint8)])
