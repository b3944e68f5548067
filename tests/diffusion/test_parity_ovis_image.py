"""Ovis-Image: our pipeline against diffusers' OvisImagePipeline on the tiny zoo model (fp32, CPU)."""

from __future__ import annotations

import pytest

from parity import BATCH_PROMPTS, ParityTests, assert_refused_at_load, assert_rejected

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.ovis_image.pipeline import OvisImage


class TestOvisImage(ParityTests):
    zoo_name = "ovis-image"
    reference_class = "OvisImagePipeline"
    pipeline_class = OvisImage
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    def test_batch_mixes_guidance_default_negatives_lengths_sizes_and_outputs(self, ours, expected, call):
        # CFG off for one; the default negative prompt "" and two outputs for another; another
        # size and prompt length form their own group.
        self.assert_batch_matches(ours, expected, [
            dict(call, prompt=BATCH_PROMPTS[0], guidance_scale=1.0),
            dict(call, prompt=BATCH_PROMPTS[1], negative_prompt=None, num_images_per_prompt=2),
            dict(call, prompt=BATCH_PROMPTS[2], height=32, width=64, max_sequence_length=32),
        ])

    def test_defaults_come_from_the_checkpoint(self, ours):
        # OvisImagePipeline: 128 latent pixels times the VAE's downsampling factor.
        side = 128 * 2 ** (len(ours.vae.config.block_out_channels) - 1)
        params = ours.prepare_params(DiffusionParams())
        assert (params.height, params.width, params.num_inference_steps, params.guidance_scale) == (side, side, 50, 5.0)
        assert params.extras == {"max_sequence_length": 256}

    @pytest.mark.parametrize("field, params", [
        ("height", DiffusionParams(height=40, width=64)),
        ("width", DiffusionParams(height=64, width=72)),
        ("max_sequence_length", DiffusionParams(height=64, width=64, extras={"max_sequence_length": 257})),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)

    @pytest.mark.parametrize("field", ["ulysses_degree"])
    def test_undeclared_accelerations_are_refused_by_name(self, path, field):
        # No sequence-parallel plan for its transformer.
        assert_refused_at_load(OvisImage, path, field)
