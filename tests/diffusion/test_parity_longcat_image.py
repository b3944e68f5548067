"""LongCat-Image: our pipeline against diffusers' LongCatImagePipeline on the tiny zoo model
(fp32, CPU). The zoo prompt quotes text, so the per-character tokenization of quotes runs."""

from __future__ import annotations

import pytest

from parity import BATCH_PROMPTS, ParityTests, assert_refused_at_load, assert_rejected, load_reference

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.longcat_image.pipeline import LongCatImage


class TestLongCatImage(ParityTests):
    zoo_name = "longcat-image"
    reference_class = "LongCatImagePipeline"
    pipeline_class = LongCatImage
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        from diffusers import LongCatImagePipeline

        # Its text_processor serves only the prompt rewrite, which the zoo call turns off.
        return load_reference(LongCatImagePipeline, path, text_processor=None)

    def test_batch_mixes_guidance_renorm_default_negatives_sizes_and_outputs(self, ours, expected, call):
        # CFG off for one; the default negative "", no renorm and two outputs for another; a
        # renorm floor and another size for the third.
        self.assert_batch_matches(ours, expected, [
            dict(call, prompt=BATCH_PROMPTS[0], guidance_scale=1.0),
            dict(call, prompt=BATCH_PROMPTS[1], negative_prompt=None, enable_cfg_renorm=False,
                 num_images_per_prompt=2),
            dict(call, prompt="write 'hello' on it", height=32, width=64, cfg_renorm_min=0.5),
        ])

    def test_defaults(self, ours):
        side = 128 * 2 ** (len(ours.vae.config.block_out_channels) - 1)
        params = ours.prepare_params(DiffusionParams())
        assert (params.height, params.width, params.num_inference_steps, params.guidance_scale) == (side, side, 50, 4.5)
        assert params.extras == {"enable_cfg_renorm": True, "cfg_renorm_min": 0.0, "enable_prompt_rewrite": False}

    @pytest.mark.parametrize("field, params", [
        ("height", DiffusionParams(height=40, width=64)),
        ("enable_prompt_rewrite", DiffusionParams(height=64, width=64, extras={"enable_prompt_rewrite": True})),
        ("cfg_renorm_min", DiffusionParams(height=64, width=64, extras={"cfg_renorm_min": 1.5})),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)

    @pytest.mark.parametrize("field", ["ulysses_degree"])
    def test_undeclared_accelerations_are_refused_by_name(self, path, field):
        # No sequence-parallel plan for its transformer.
        assert_refused_at_load(LongCatImage, path, field)
