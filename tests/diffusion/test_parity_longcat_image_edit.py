"""LongCat-Image-Edit: our pipeline against diffusers' LongCatImageEditPipeline on the tiny zoo
model (fp32, CPU).

diffusers takes no output size: it generates about a megapixel at the input image's aspect ratio
(`calculate_dimensions`), which even the tiny model denoises slowly. The reference here is told
the size the test asks for through that one function, as if it had computed it; the rest of its
call is diffusers' own. `test_default_size_is_diffusers` checks the megapixel default apart.
The alone and staggered tests use the batch test's prompts and seeds, so the class's cached
reference outputs serve them all.
"""

from __future__ import annotations

import pytest

from parity import BATCH_PROMPTS, BatchSeededParityTests, assert_rejected, load_reference, sized_reference

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.longcat_image.edit_pipeline import LongCatImageEdit
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

SIDE = 64  # the output size the reference is told


class TestLongCatImageEdit(BatchSeededParityTests):
    zoo_name = "longcat-image-edit"
    reference_class = "LongCatImageEditPipeline"
    pipeline_class = LongCatImageEdit
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        """The zoo's call with the zoo's input image and an output size (see the module note)."""
        return dict(zoo_call_kwargs(cls.zoo_name), image=default_input_image(), height=SIDE, width=SIDE)

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        from diffusers import LongCatImageEditPipeline
        from diffusers.pipelines.longcat_image import pipeline_longcat_image_edit
        from transformers import Qwen2VLProcessor

        from omnistage.models.qwen_image.vl_processor import processor_from_parts

        pipe = load_reference(LongCatImageEditPipeline, path,
                              text_processor=processor_from_parts(Qwen2VLProcessor, path, "text_processor"))
        return sized_reference(pipe, pipeline_longcat_image_edit)

    def batch_calls(self, call):
        # Two in one transformer call: the alone call, and another input image with two outputs.
        from PIL import Image

        image = default_input_image().transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return [dict(call, prompt=BATCH_PROMPTS[0]),
                dict(call, prompt=BATCH_PROMPTS[1], image=image, num_images_per_prompt=2)]

    def test_default_size_is_diffusers(self, ours):
        from diffusers.pipelines.longcat_image.pipeline_longcat_image_edit import calculate_dimensions

        image = default_input_image().resize((96, 48))
        request = ours.prepare_request(DiffusionRequest("r", "make it blue", DiffusionParams(), images=[image]))
        assert (request.params.width, request.params.height) == calculate_dimensions(1024 * 1024, 2.0)
        params = request.params
        assert (params.num_inference_steps, params.guidance_scale, params.extras) == (50, 4.5, {})

    @pytest.mark.parametrize("field, params, images", [
        ("one input image", DiffusionParams(height=64, width=64), [default_input_image()] * 2),
        ("height", DiffusionParams(height=40, width=64), [default_input_image()]),
        ("enable_cfg_renorm", DiffusionParams(extras={"enable_cfg_renorm": True}), [default_input_image()]),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params, images):
        assert_rejected(ours, field, params, images, prompt="make it blue")
