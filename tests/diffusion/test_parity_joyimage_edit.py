"""JoyAI-Image-Edit: our pipeline against diffusers' JoyImageEditPipeline on the tiny zoo model
(fp32, CPU).

diffusers snaps the output size to its nearest ~1-megapixel bucket, which even the tiny model
denoises slowly: the reference is told the size the test asks for through that one function
(`find_best_bucket`), as if it had picked it; the rest of its call is its own. The zoo VAE's
posterior has no spread (joyimage_models.py), so diffusers' unseeded sample of the input
image's latents is its mean, as ours is. The alone and staggered tests use the batch test's
prompts and seeds, so the class's cached reference outputs serve them all.
"""

from __future__ import annotations

from unittest import mock

import pytest

from parity import BATCH_PROMPTS, BatchSeededParityTests, assert_rejected, load_reference

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.joyimage.pipeline import JoyImageEdit
from omnistage.testing.diffusion_models import default_input_image


class TestJoyImageEdit(BatchSeededParityTests):
    zoo_name = "joyai-image-edit"
    reference_class = "JoyImageEditPipeline"
    pipeline_class = JoyImageEdit
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls, path):
        from omnistage.testing import call_kwargs

        return dict(call_kwargs(cls.zoo_name), image=default_input_image())

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        from diffusers import JoyImageEditPipeline
        from diffusers.pipelines.joyimage import image_processor
        from transformers import Qwen3VLProcessor

        from omnistage.models.qwen_image.vl_processor import processor_from_parts

        pipe = load_reference(JoyImageEditPipeline, path, processor=processor_from_parts(Qwen3VLProcessor, path))

        def reference(height: int, width: int, **kwargs):
            with mock.patch.object(image_processor, "find_best_bucket", lambda h, w, base: (height, width)):
                return pipe(height=height, width=width, **kwargs)

        return reference

    def batch_calls(self, call):
        # Prompts of different lengths (separate transformer calls), another input image with two outputs.
        from PIL import Image

        image = default_input_image().transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return [dict(call, prompt=BATCH_PROMPTS[0]),
                dict(call, prompt=BATCH_PROMPTS[0], image=image, num_images_per_prompt=2),
                dict(call, prompt=BATCH_PROMPTS[1])]

    def test_default_size_is_diffusers_bucket(self, ours):
        from diffusers.pipelines.joyimage.image_processor import find_best_bucket

        image = default_input_image().resize((96, 48))
        request = ours.prepare_request(DiffusionRequest("r", "make it blue", DiffusionParams(), images=[image]))
        assert (request.params.height, request.params.width) == find_best_bucket(48, 96, 1024)
        assert (request.params.num_inference_steps, request.params.guidance_scale) == (40, 4.0)

    @pytest.mark.parametrize("field, params, images", [
        ("one input image", DiffusionParams(height=64, width=64), [default_input_image()] * 2),
        ("height", DiffusionParams(height=40, width=64), [default_input_image()]),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params, images):
        assert_rejected(ours, field, params, images, prompt="make it blue")
