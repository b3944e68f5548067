"""FLUX.1: our pipeline against diffusers' FluxPipeline on the tiny zoo model (fp32, CPU)."""

from __future__ import annotations

import pytest

from parity import BATCH_PROMPTS, ParityTests, assert_rejected

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.flux.pipeline import Flux


class TestFlux(ParityTests):
    zoo_name = "flux"
    reference_class = "FluxPipeline"
    pipeline_class = Flux
    staggered_short = {"true_cfg_scale": 2.0}  # the joining request alone runs true CFG

    def test_the_zoo_model_uses_the_guidance_embedding(self, ours):
        # The guidance-embedding path is the one FLUX.1-dev takes; make sure the tests cover it.
        assert ours.transformer.config.guidance_embeds

    def test_batch_mixes_true_cfg_guidance_sizes_and_outputs(self, ours, expected, call):
        # True CFG adds an uncond pass for one request only; another size forms its own group.
        self.assert_batch_matches(ours, expected, [
            dict(call, prompt=BATCH_PROMPTS[0], true_cfg_scale=2.5),
            dict(call, prompt=BATCH_PROMPTS[1], guidance_scale=1.5, num_images_per_prompt=2),
            dict(call, prompt=BATCH_PROMPTS[2], height=32, width=64, max_sequence_length=32),
        ])

    def test_defaults_come_from_the_checkpoint(self, ours):
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
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)
