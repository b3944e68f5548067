"""Qwen-Image-Edit-Plus: our pipeline against diffusers' QwenImageEditPlusPipeline on the tiny zoo model.

diffusers' pipeline takes one prompt per call, so every batch is compared with each of its
requests run alone. Requests in a batch carry different numbers of input images (1-3), of
different shapes, so the batch also mixes token-grid layouts. Like the edit model, each
input image is VAE-encoded at about 1024x1024: the alone and staggered tests reuse the batch
test's calls and seeds, so the class's cached reference outputs serve them all.
"""

from __future__ import annotations

import pytest

from parity import (BATCH_PROMPTS, BATCH_SEEDS, BatchSeededParityTests, assert_rejected, load_reference, max_abs_diff,
                    run_arrays)
from test_parity_qwen_image_edit import qwen2_vl_processor

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.qwen_image.edit_pipeline import condition_size
from omnistage.models.qwen_image.edit_plus_pipeline import QwenImageEditPlus
from omnistage.testing.diffusion_models import default_input_image
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.qwen_image_edit_plus_models import NAME

pytestmark = pytest.mark.slow


def input_images():
    """Three distinct inputs: the zoo gradient, it mirrored, and a 2:1 crop of it."""
    from PIL import ImageOps

    base = default_input_image()
    return [base, ImageOps.mirror(base), base.resize((96, 48))]


IMAGE_COUNTS = (1, 3, 2)  # per batch request; BATCH_PROMPTS[1] carries all three


class TestQwenImageEditPlus(BatchSeededParityTests):
    zoo_name = NAME
    reference_class = "QwenImageEditPlusPipeline"
    pipeline_class = QwenImageEditPlus
    staggered_short = {"image": input_images()}

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        """The reference call: the zoo's defaults with one input image."""
        return dict(zoo_call_kwargs(NAME), image=[default_input_image()])

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        from diffusers import QwenImageEditPlusPipeline

        return load_reference(QwenImageEditPlusPipeline, path, processor=qwen2_vl_processor(path))

    def batch_calls(self, call):
        images = input_images()
        return [dict(call, prompt=p, image=images[:n]) for p, n in zip(BATCH_PROMPTS, IMAGE_COUNTS)]

    def test_the_zoo_call_runs_true_cfg(self, call):
        assert call["true_cfg_scale"] > 1 and call["negative_prompt"]

    def test_three_images_alone_match_diffusers(self, ours, expected, call):
        call = self.batch_calls(call)[1]
        assert len(call["image"]) == 3
        (got,) = run_arrays(ours, [self.request(call, BATCH_SEEDS[1])])
        assert max_abs_diff(got, expected(call, BATCH_SEEDS[1])) <= 1e-3

    def test_each_image_joins_both_encoders(self, ours, call):
        # Random weights barely react to an extra image, so check what the transformer is given:
        # each image adds its own token grid after the target's and its vision tokens to the prompt.
        one, two = ours.encode([ours.prepare_request(self.request(dict(call, image=input_images()[:n]), 5, f"r{n}")) for n in (1, 2)])
        assert len(one.cond["img_shapes"]) == 2 and len(two.cond["img_shapes"]) == 3
        grid_tokens = [f * h * w for f, h, w in two.cond["img_shapes"][1:]]
        assert two.cond["image_latents"].shape[1] == sum(grid_tokens) == 2 * one.cond["image_latents"].shape[1]
        assert two.cond["prompt_embeds"].shape[0] > one.cond["prompt_embeds"].shape[0]

    def test_default_size_follows_the_last_image(self, ours):
        images = input_images()
        request = ours.prepare_request(DiffusionRequest("r", "merge them", DiffusionParams(), images=images))
        width, height = condition_size(images[-1])
        assert (request.params.width, request.params.height) == (width, height)
        assert width / height == pytest.approx(2, rel=0.05)

    def test_more_than_three_images_are_rejected(self, ours):
        images = input_images() + [default_input_image()]
        assert_rejected(ours, "1 to 3 input images", DiffusionParams(height=64, width=64), images, prompt="merge")
