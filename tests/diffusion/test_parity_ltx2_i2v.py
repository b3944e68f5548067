"""LTX-2 image-to-video: our LTX2I2V against diffusers' LTX2ImageToVideoPipeline on the tiny zoo
model (fp32, CPU): the video and its soundtrack, alone, in a batch of two and staggered, with
diffusers' guidance defaults (CFG, STG, modality isolation, rescale) and its H.264 re-compression
of the image (CRF 33) on."""

from __future__ import annotations

import numpy as np
import pytest

from parity import (
    BATCH_PROMPTS,
    BATCH_SEEDS,
    TOLERANCE,
    BatchSeededParityTests,
    assert_rejected,
    max_abs_diff,
    SoundtrackFixtures,
)

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.ltx2.pipeline import LTX2I2V
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

# Two steps: the staggered test's short request is the batch's second call.
CALL = dict(zoo_call_kwargs("ltx2-i2v"), num_inference_steps=2, image=default_input_image(64))


class TestLTX2I2V(SoundtrackFixtures, BatchSeededParityTests):
    zoo_name = "ltx2-i2v"
    reference_class = "LTX2ImageToVideoPipeline"
    pipeline_class = LTX2I2V

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return CALL

    def batch_calls(self, call):
        # Another image and negative prompt, CFG off, for the second.
        from PIL import Image

        return [dict(call, prompt=BATCH_PROMPTS[0]),
                dict(call, prompt=BATCH_PROMPTS[1], negative_prompt="a dog", guidance_scale=1.0,
                     audio_guidance_scale=1.0, image=call["image"].transpose(Image.Transpose.FLIP_LEFT_RIGHT))]

    def test_soundtrack_matches_diffusers(self, ours, reference_av, call):
        calls = self.batch_calls(call)
        states = ours.denoise([self.request(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, BATCH_SEEDS))])
        for (_, audio), c, s in zip(ours.decode_av(states), calls, BATCH_SEEDS):
            want = reference_av(c, s)[1]
            assert audio.shape == want.shape and np.abs(want).max() > 1e-3
            assert max_abs_diff(audio, want) <= TOLERANCE

    @pytest.mark.parametrize("field, params", [
        ("image_crf", DiffusionParams(height=64, width=64, num_frames=9, extras={"image_crf": -1})),
        ("height", DiffusionParams(height=48, width=64, num_frames=9)),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params, images=[default_input_image(64)])

    def test_defaults_follow_diffusers(self, ours):
        params = ours.prepare_params(DiffusionParams())
        assert (params.height, params.width, params.num_frames) == (512, 704, 161)
