"""Krea 2: our pipeline against diffusers' Krea2Pipeline on the tiny zoo model (fp32, CPU)."""

from __future__ import annotations

import pytest

from parity import BATCH_PROMPTS, ParityTests, assert_refused_at_load, assert_rejected

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.krea2.pipeline import Krea2


class TestKrea2(ParityTests):
    zoo_name = "krea2"
    reference_class = "Krea2Pipeline"
    pipeline_class = Krea2
    staggered_short = {"guidance_scale": 0.0}  # the joining request alone runs without CFG (scale 0)

    def test_batch_mixes_guidance_default_negatives_lengths_sizes_and_outputs(self, ours, expected, call):
        # CFG off (scale 0) for one; the default negative prompt "" and two outputs for another;
        # another size and text length form their own group.
        self.assert_batch_matches(ours, expected, [
            dict(call, prompt=BATCH_PROMPTS[0], guidance_scale=0.0),
            dict(call, prompt=BATCH_PROMPTS[1], negative_prompt=None, num_images_per_prompt=2),
            dict(call, prompt=BATCH_PROMPTS[2], height=32, width=64, max_sequence_length=32),
        ])

    def test_checkpoint_facts(self, ours):
        # The taps and the schedule kind come from model_index.json.
        assert ours.select_layers == (1, 2) and not ours.is_distilled and ours.patch_size == 2
        params = ours.prepare_params(DiffusionParams())
        assert (params.height, params.width, params.num_inference_steps, params.guidance_scale) == (1024, 1024, 28, 4.5)
        assert params.extras == {"max_sequence_length": 512}

    @pytest.mark.parametrize("field, params", [
        ("height", DiffusionParams(height=40, width=64)),
        ("width", DiffusionParams(height=64, width=72)),
        ("max_sequence_length", DiffusionParams(height=64, width=64, extras={"max_sequence_length": 0})),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)

    @pytest.mark.parametrize("field", ["ulysses_degree"])
    def test_undeclared_accelerations_are_refused_by_name(self, path, field):
        # No sequence-parallel plan for its transformer.
        assert_refused_at_load(Krea2, path, field)
