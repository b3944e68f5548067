"""HiDream-I1: our pipeline against diffusers' HiDreamImagePipeline on the tiny zoo model (fp32, CPU).

diffusers rescales height x width to its default area, (default_sample_size * VAE factor)**2,
1024**2; the reference here gets default_sample_size = the tiny side / 8, so it keeps the asked
64x64, which is what our pipeline generates. The alone and staggered tests use the batch
test's prompts and seeds, so the cached reference outputs serve them all.
"""

from __future__ import annotations

import pytest

from parity import (BATCH_PROMPTS, TOLERANCE, BatchSeededParityTests, assert_rejected, load_reference, max_abs_diff,
                    run_arrays)

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.hidream_image.pipeline import HiDreamImage
from omnistage.testing.diffusion_components import IMAGE_SIDE


class TestHiDreamImage(BatchSeededParityTests):
    zoo_name = "hidream-image"
    reference_class = "HiDreamImagePipeline"
    pipeline_class = HiDreamImage
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        from diffusers import HiDreamImagePipeline

        pipe = load_reference(HiDreamImagePipeline, path)
        pipe.default_sample_size = IMAGE_SIDE["tiny"] // pipe.vae_scale_factor  # its area: the asked 64x64
        return pipe

    def batch_calls(self, call):
        # Two in one transformer call: the alone call, and the default negative prompt with two outputs.
        return [dict(call, prompt=BATCH_PROMPTS[0]),
                dict(call, prompt=BATCH_PROMPTS[1], negative_prompt=None, num_images_per_prompt=2)]

    def test_non_square_matches_diffusers(self, ours, expected, call):
        # The transformer pads a non-square image's tokens (masked); 32x128 has the reference's area.
        call = dict(call, prompt=BATCH_PROMPTS[2], height=32, width=128, num_inference_steps=2)
        (got,) = run_arrays(ours, [self.request(call, 5)])
        assert max_abs_diff(got, expected(call, 5)) <= TOLERANCE

    def test_defaults(self, ours):
        params = ours.prepare_params(DiffusionParams())
        assert (params.height, params.width, params.num_inference_steps, params.guidance_scale) == (1024, 1024, 50, 5.0)
        assert params.extras == {"max_sequence_length": 128}

    @pytest.mark.parametrize("field, params", [
        ("height", DiffusionParams(height=40, width=64)),
        ("height", DiffusionParams(height=64, width=512)),  # non-square, more patches than the transformer pads to
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)
