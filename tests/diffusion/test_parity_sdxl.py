"""Stable Diffusion XL: our pipeline against diffusers' StableDiffusionXLPipeline on the tiny zoo model (fp32, CPU)."""

from __future__ import annotations

import pytest

from parity import BATCH_PROMPTS, ParityTests, assert_rejected

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.params import DiffusionParams
from omnistage.models.sdxl.pipeline import StableDiffusionXL


class TestStableDiffusionXL(ParityTests):
    zoo_name = "sdxl"
    reference_class = "StableDiffusionXLPipeline"
    pipeline_class = StableDiffusionXL
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    def test_batch_mixes_guidance_zeroed_negatives_rescale_sizes_and_outputs(self, ours, expected, call):
        # CFG off for one; zero uncond embeddings (no negative prompt, force_zeros_for_empty_prompt)
        # with guidance_rescale and two outputs for another; another size forms its own group.
        self.assert_batch_matches(ours, expected, [
            dict(call, prompt=BATCH_PROMPTS[0], guidance_scale=1.0),
            dict(call, prompt=BATCH_PROMPTS[1], negative_prompt=None, guidance_rescale=0.7, num_images_per_prompt=2),
            dict(call, prompt=BATCH_PROMPTS[2], height=32, width=64),
        ])

    def test_defaults_come_from_the_checkpoint(self, ours):
        # StableDiffusionXLPipeline: the UNet's sample_size times the VAE's downsampling factor.
        side = ours.unet.config.sample_size * 2 ** (len(ours.vae.config.block_out_channels) - 1)
        params = ours.prepare_params(DiffusionParams())
        assert (params.height, params.width, params.num_inference_steps, params.guidance_scale) == (side, side, 50, 5.0)
        assert params.extras == {"guidance_rescale": 0.0}
        assert ours.force_zeros_for_empty_prompt

    @pytest.mark.parametrize("field, params", [
        ("height", DiffusionParams(height=36, width=64)),
        ("width", DiffusionParams(height=64, width=68)),
        ("guidance_rescale", DiffusionParams(height=64, width=64, extras={"guidance_rescale": 1.5})),
        ("max_sequence_length", DiffusionParams(height=64, width=64, extras={"max_sequence_length": 64})),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)

    @pytest.mark.parametrize("fields, field", [
        ({"cache_backend": "first_block_cache"}, "cache_backend"),
        ({"quantization": "int8"}, "quantization"),
        ({"compile": True}, "compile"),
        ({"executor": "mp", "num_devices": 2, "ulysses_degree": 2}, "ulysses_degree"),
    ])
    def test_undeclared_accelerations_are_refused_by_name(self, path, fields, field):
        # They act on a transformer; SDXL denoises with a UNet.
        with pytest.raises(ValueError, match=field):
            StableDiffusionXL.from_pretrained(path, deploy=StageDeployConfig(**fields))
