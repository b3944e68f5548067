"""LTX-2 conditions: our LTX2Condition against diffusers' LTX2ConditionPipeline on the tiny zoo
model (fp32, CPU): images at latent frame 0 (written into the first frame) and at later frames
(appended keyframe tokens, with a strength below 1), the video and its soundtrack, alone, in a
batch of two and staggered."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from parity import (
    BATCH_PROMPTS,
    BATCH_SEEDS,
    TOLERANCE,
    BatchSeededParityTests,
    assert_rejected,
    load_reference,
    max_abs_diff,
    SoundtrackFixtures,
)

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.ltx2.pipeline import LTX2Condition
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

IMAGE = default_input_image(64)
# The request's form of diffusers' conditions: one image per latent frame index, each with a strength.
CALL = dict(zoo_call_kwargs("ltx2-condition"), num_inference_steps=2,
            image=[IMAGE, IMAGE.transpose(Image.Transpose.FLIP_LEFT_RIGHT)],
            condition_indices=[0, 2], condition_strengths=[1.0, 0.8])


class TestLTX2Condition(SoundtrackFixtures, BatchSeededParityTests):
    zoo_name = "ltx2-condition"
    reference_class = "LTX2ConditionPipeline"
    pipeline_class = LTX2Condition

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return CALL

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        """diffusers' pipeline called with LTX2VideoCondition objects built from the request's form."""
        from diffusers import LTX2ConditionPipeline
        from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition

        pipe = load_reference(LTX2ConditionPipeline, path)

        def call(image, condition_indices, condition_strengths, **kwargs):
            conditions = [LTX2VideoCondition(frames=i, index=n, strength=s)
                          for i, n, s in zip(image, condition_indices, condition_strengths)]
            return pipe(conditions=conditions, **kwargs)

        return call

    def batch_calls(self, call):
        # The second: one keyframe at the last latent frame at half strength, CFG off (fewer tokens:
        # its own group).
        return [dict(call, prompt=BATCH_PROMPTS[0]),
                dict(call, prompt=BATCH_PROMPTS[1], guidance_scale=1.0, audio_guidance_scale=1.0,
                     image=[IMAGE], condition_indices=[-1], condition_strengths=[0.5])]

    def test_soundtrack_matches_diffusers(self, ours, reference_av, call):
        calls = self.batch_calls(call)
        states = ours.denoise([self.request(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, BATCH_SEEDS))])
        for (_, audio), c, s in zip(ours.decode_av(states), calls, BATCH_SEEDS):
            assert max_abs_diff(audio, reference_av(c, s)[1]) <= TOLERANCE

    def test_stage_two_schedule_starts_the_conditions_at_its_first_sigma(self, ours, path, call):
        # The distilled stage-2 sigmas, unshifted (diffusers' recipe swaps in this scheduler), and the
        # conditions noised to their first sigma, LTX2ConditionPipeline's noise_scale default with sigmas.
        import torch
        from diffusers import FlowMatchEulerDiscreteScheduler, LTX2ConditionPipeline
        from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition
        from diffusers.pipelines.ltx2.utils import STAGE_2_DISTILLED_SIGMA_VALUES as SIGMAS

        pipe = load_reference(LTX2ConditionPipeline, path)
        pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config, use_dynamic_shifting=False,
                                                                     shift_terminal=None)
        plain = dict(call, guidance_scale=1.0, stg_scale=0.0, modality_scale=1.0)
        kwargs = {k: v for k, v in plain.items() if k not in ("image", "condition_indices", "condition_strengths")}
        conditions = [LTX2VideoCondition(frames=i, index=n, strength=s) for i, n, s in
                      zip(plain["image"], plain["condition_indices"], plain["condition_strengths"])]
        want = pipe(conditions=conditions, **{**kwargs, "num_inference_steps": len(SIGMAS)}, sigmas=SIGMAS,
                    generator=torch.Generator().manual_seed(3), output_type="np").frames[0]
        request = self.request(dict(plain, num_inference_steps=None, schedule="distilled_stage_2"), 3)
        (state,) = ours.denoise([request])
        assert state.num_steps == len(SIGMAS)
        assert max_abs_diff(ours.decode_arrays([state])[0], want) <= TOLERANCE

    def test_keyframes_are_appended_tokens(self, ours, call):
        (state,) = ours.encode([ours.prepare_request(self.request(dict(call, prompt=BATCH_PROMPTS[0]), 0))])
        frames, h, w = state.cond["video_shape"]
        assert state.latents.shape[1] == (frames + 1) * h * w  # one keyframe's tokens after the video's
        assert state.cond["conditioning_mask"][0, -1] == pytest.approx(0.8)

    @pytest.mark.parametrize("field, extras, images", [
        ("condition_indices", {}, [IMAGE, IMAGE]),  # several images need their frames
        ("condition_indices", {"condition_indices": [5]}, [IMAGE]),  # 9 frames are 5 latent frames
        ("condition_indices", {"condition_indices": [0, 1]}, [IMAGE]),
        ("condition_strengths", {"condition_strengths": [1.5]}, [IMAGE]),
    ])
    def test_bad_conditions_are_rejected(self, ours, field, extras, images):
        params = DiffusionParams(height=64, width=64, num_frames=9, extras=extras)
        assert_rejected(ours, field, params, images)

    def test_input_images_are_checked(self, ours):
        # Images are optional (text-to-video without); what is given must be an image.
        assert_rejected(ours, "image", DiffusionParams(height=64, width=64, num_frames=9),
                        [np.zeros((64, 64, 3), np.uint8)])
