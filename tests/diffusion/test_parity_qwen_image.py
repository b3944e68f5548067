"""Qwen-Image: our pipeline against diffusers' QwenImagePipeline on the tiny zoo model (fp32, CPU)."""

from __future__ import annotations

from parity import BATCH_PROMPTS, ParityTests, assert_rejected

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.qwen_image.pipeline import QwenImage


class TestQwenImage(ParityTests):
    zoo_name = "qwen-image"
    reference_class = "QwenImagePipeline"
    pipeline_class = QwenImage
    # The batch test's prompts differ in length: the batch pads the prompt embeddings and masks the padding.

    def test_the_zoo_call_runs_true_cfg(self, call):
        assert call["true_cfg_scale"] > 1 and call["negative_prompt"]

    def test_batch_mixes_cfg_scales_sizes_and_outputs(self, ours, expected, call):
        self.assert_batch_matches(ours, expected, [
            dict(call, prompt=BATCH_PROMPTS[0], negative_prompt=None),  # no negative prompt: CFG off
            dict(call, prompt=BATCH_PROMPTS[1], true_cfg_scale=3.0, num_images_per_prompt=2),
            dict(call, prompt=BATCH_PROMPTS[2], height=32, width=64, max_sequence_length=8),  # its own group
        ])

    def test_default_size_comes_from_the_checkpoint(self, ours):
        params = ours.prepare_params(DiffusionParams())
        assert params.height == params.width == ours.default_sample_size * ours.vae_scale_factor
        assert params.num_inference_steps == 50 and params.true_cfg_scale == 4.0

    def test_unknown_extra_is_rejected(self, ours):
        assert_rejected(ours, "cfg_truncation", DiffusionParams(extras={"cfg_truncation": 0.5}))

    def test_max_sequence_length_is_bounded(self, ours):
        assert_rejected(ours, "max_sequence_length", DiffusionParams(extras={"max_sequence_length": 2048}))

    def test_guidance_scale_needs_a_distilled_model(self, ours):
        assert not ours.transformer.config.guidance_embeds
        assert_rejected(ours, "guidance_scale", DiffusionParams(guidance_scale=3.5, height=64, width=64))

    def test_size_not_divisible_is_rejected(self, ours):
        assert_rejected(ours, "width", DiffusionParams(height=64, width=72))
