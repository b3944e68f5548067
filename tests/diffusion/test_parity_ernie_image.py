"""ERNIE-Image: our pipeline against diffusers' ErnieImagePipeline on the tiny zoo model (fp32, CPU)."""

from __future__ import annotations

import pytest

from parity import BATCH_PROMPTS, ParityTests, assert_refused_at_load, assert_rejected

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.ernie_image.pipeline import ErnieImage


class TestErnieImage(ParityTests):
    zoo_name = "ernie-image"
    reference_class = "ErnieImagePipeline"
    pipeline_class = ErnieImage
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    def test_batch_mixes_guidance_default_negatives_sizes_and_outputs(self, ours, expected, call):
        # CFG off for one; the default negative prompt "" (its BOS token alone) and two outputs
        # for another; another size forms its own group.
        self.assert_batch_matches(ours, expected, [
            dict(call, prompt=BATCH_PROMPTS[0], guidance_scale=1.0),
            dict(call, prompt=BATCH_PROMPTS[1], negative_prompt=None, num_images_per_prompt=2),
            dict(call, prompt=BATCH_PROMPTS[2], height=32, width=64),
        ])

    def test_the_reference_runs_no_prompt_enhancer(self, reference):
        # The zoo checkpoint has no `pe`, so diffusers' default use_pe=True rewrites nothing.
        assert reference.pe is None

    def test_defaults_and_no_prompt_enhancer(self, ours):
        params = ours.prepare_params(DiffusionParams())
        assert (params.height, params.width, params.num_inference_steps, params.guidance_scale) == (1024, 1024, 50, 4.0)
        assert params.extras == {}
        assert "pe" not in ours.components or ours.components["pe"] is None

    @pytest.mark.parametrize("field, params", [
        ("height", DiffusionParams(height=40, width=64)),
        ("width", DiffusionParams(height=64, width=72)),
        ("use_pe", DiffusionParams(height=64, width=64, extras={"use_pe": True})),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)

    @pytest.mark.parametrize("field", ["cache_backend", "ulysses_degree"])
    def test_undeclared_accelerations_are_refused_by_name(self, path, field):
        # No step-cache blocks (they run sequence-first) and no sequence-parallel plan.
        assert_refused_at_load(ErnieImage, path, field)
