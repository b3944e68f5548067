"""Stable Diffusion 3: our pipeline against diffusers' StableDiffusion3Pipeline on the tiny zoo model (fp32, CPU)."""

from __future__ import annotations

import pytest

from parity import BATCH_PROMPTS, ParityTests, assert_rejected

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.sd3.pipeline import StableDiffusion3


class TestStableDiffusion3(ParityTests):
    zoo_name = "sd3"
    reference_class = "StableDiffusion3Pipeline"
    pipeline_class = StableDiffusion3
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    def test_batch_mixes_guidance_negative_prompts_sizes_and_outputs(self, ours, expected, call):
        # CFG off (guidance 1) skips the uncond rows for one request; another size forms its own group.
        self.assert_batch_matches(ours, expected, [
            dict(call, prompt=BATCH_PROMPTS[0], guidance_scale=1.0),
            dict(call, prompt=BATCH_PROMPTS[1], negative_prompt="a dog", num_images_per_prompt=2),
            dict(call, prompt=BATCH_PROMPTS[2], height=32, width=64, max_sequence_length=32),
        ])

    def test_defaults_come_from_the_checkpoint(self, ours):
        # StableDiffusion3Pipeline: the transformer's sample_size times the VAE's downsampling factor.
        side = ours.transformer.config.sample_size * 2 ** (len(ours.vae.config.block_out_channels) - 1)
        params = ours.prepare_params(DiffusionParams())
        assert (params.height, params.width, params.num_inference_steps, params.guidance_scale) == (side, side, 28, 7.0)
        assert params.extras == {"max_sequence_length": 256}

    @pytest.mark.parametrize("field, params", [
        ("height", DiffusionParams(height=40, width=64)),
        ("width", DiffusionParams(height=64, width=72)),
        ("max_sequence_length", DiffusionParams(height=64, width=64, extras={"max_sequence_length": 513})),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)
