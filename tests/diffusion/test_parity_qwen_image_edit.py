"""Qwen-Image-Edit: our pipeline against diffusers' QwenImageEditPipeline on the tiny zoo model.

diffusers resizes every input image to about 1024x1024 for the VAE, so each generation
VAE-encodes a megapixel image even at the tiny size: the slowest parity module. The alone
and staggered tests use the batch test's prompts and seeds, so the class's cached reference
outputs (the `expected` fixture) serve them all.
"""

from __future__ import annotations

import pytest

from parity import BatchSeededParityTests, assert_rejected, load_reference, request_for

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.qwen_image.edit_pipeline import QwenImageEdit, condition_size
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

pytestmark = pytest.mark.slow


def qwen2_vl_processor(path):
    """The checkpoint's real Qwen2VLProcessor, built from its two halves: transformers 5.24
    refuses to construct one without torchvision, which diffusers' pipeline needs to be
    called at all (omnistage/models/qwen_image/vl_processor.py)."""
    from transformers import Qwen2VLProcessor

    from omnistage.models.qwen_image.vl_processor import processor_from_parts

    return processor_from_parts(Qwen2VLProcessor, path)


class TestQwenImageEdit(BatchSeededParityTests):
    zoo_name = "qwen-image-edit"
    reference_class = "QwenImageEditPipeline"
    pipeline_class = QwenImageEdit

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        """The reference call: the zoo's defaults with the zoo's input image."""
        return dict(zoo_call_kwargs(cls.zoo_name), image=default_input_image())

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        from diffusers import QwenImageEditPipeline

        return load_reference(QwenImageEditPipeline, path, processor=qwen2_vl_processor(path))

    def request(self, call_kwargs, seed, request_id="req"):
        # diffusers' edit pipeline accepts max_sequence_length and ignores it; ours rejects it.
        return request_for({k: v for k, v in call_kwargs.items() if k != "max_sequence_length"}, seed, request_id)

    def test_the_zoo_call_runs_true_cfg(self, call):
        assert call["true_cfg_scale"] > 1 and call["negative_prompt"]

    def test_default_size_follows_the_input_image(self, ours):
        image = default_input_image().resize((96, 48))
        request = ours.prepare_request(DiffusionRequest("r", "make it blue", DiffusionParams(), images=[image]))
        width, height = condition_size(image)
        assert (request.params.width, request.params.height) == (width, height)
        assert width / height == pytest.approx(2, rel=0.05) and width * height == pytest.approx(1024 * 1024, rel=0.05)

    def test_more_than_one_image_is_rejected(self, ours):
        images = [default_input_image(), default_input_image()]
        assert_rejected(ours, "one input image", DiffusionParams(height=64, width=64), images, prompt="make it blue")

    def test_unknown_extra_is_rejected(self, ours):
        # Including max_sequence_length, which the edit pipeline would silently ignore.
        assert_rejected(ours, "max_sequence_length", DiffusionParams(extras={"max_sequence_length": 64}),
                        [default_input_image()], prompt="make it blue")
