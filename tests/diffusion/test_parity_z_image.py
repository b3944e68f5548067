"""Z-Image: our pipeline against diffusers' ZImagePipeline on the tiny zoo model (fp32, CPU)."""

from __future__ import annotations

from parity import BATCH_PROMPTS, ParityTests, assert_rejected

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.z_image.pipeline import ZImage


class TestZImage(ParityTests):
    zoo_name = "z-image"
    reference_class = "ZImagePipeline"
    pipeline_class = ZImage

    def test_batch_mixes_sizes_guidance_and_outputs(self, ours, expected, call):
        # The transformer pads a list of latents itself, so one call mixes image sizes, CFG on/off
        # and several outputs per prompt.
        self.assert_batch_matches(ours, expected, [
            dict(call, prompt=BATCH_PROMPTS[0], height=32, width=64),
            dict(call, prompt=BATCH_PROMPTS[1], guidance_scale=0.0),
            dict(call, prompt=BATCH_PROMPTS[2], num_images_per_prompt=2, cfg_normalization=1.0, cfg_truncation=0.5),
        ])

    def test_unknown_extra_is_rejected(self, ours):
        assert_rejected(ours, "strength", DiffusionParams(extras={"strength": 0.5}))

    def test_extra_out_of_range_is_rejected(self, ours):
        assert_rejected(ours, "cfg_truncation", DiffusionParams(extras={"cfg_truncation": -1.0}))

    def test_size_not_divisible_is_rejected(self, ours):
        assert_rejected(ours, "height", DiffusionParams(height=40, width=64))
