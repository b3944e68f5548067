"""Qwen-Image-Layered: our pipeline against diffusers' QwenImageLayeredPipeline on the tiny zoo
model (fp32, CPU): an RGBA image decomposed into RGBA layers.

diffusers takes no output size: it generates `resolution`**2 pixels (640 at least) at the input
image's aspect ratio. The reference here is told the size the test asks for through that one
function (`calculate_dimensions`), as if it had computed it; the rest of its call is diffusers'
own. `test_default_size_is_diffusers` checks the default apart. diffusers returns a list of
[layers, H, W, 4] arrays per call (its slicing misplaces them beyond one output); concatenated
they are the layers in order, what our pipeline returns per request. The alone and staggered
tests use the batch test's prompts and seeds, so the cached reference outputs serve them all.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from parity import BATCH_PROMPTS, BatchSeededParityTests, assert_rejected, load_reference, sized_reference

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.qwen_image.layered_pipeline import QwenImageLayered
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

SIDE = 64


def rgba_input_image():
    """The zoo's input image with a transparent left half."""
    from PIL import Image

    image = default_input_image().convert("RGBA")
    alpha = np.full((SIDE, SIDE), 255, np.uint8)
    alpha[:, : SIDE // 2] = 0
    image.putalpha(Image.fromarray(alpha))
    return image


class TestQwenImageLayered(BatchSeededParityTests):
    zoo_name = "qwen-image-layered"
    reference_class = "QwenImageLayeredPipeline"
    pipeline_class = QwenImageLayered
    staggered_short = {"true_cfg_scale": 1.0}  # the joining request alone runs without CFG

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        """The zoo's call with an RGBA input image and an output size (see the module note)."""
        return dict(zoo_call_kwargs(cls.zoo_name), image=rgba_input_image(), height=SIDE, width=SIDE)

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        from diffusers import QwenImageLayeredPipeline
        from diffusers.pipelines.qwenimage import pipeline_qwenimage_layered

        # Its processor only captions an empty prompt (not run; every call here has a prompt).
        sized = sized_reference(load_reference(QwenImageLayeredPipeline, path, processor=None),
                                pipeline_qwenimage_layered)

        def reference(**kwargs):
            return SimpleNamespace(images=np.concatenate(sized(**kwargs).images))

        return reference

    def batch_calls(self, call):
        # Two in one transformer call: the alone call, and an opaque input image with two outputs.
        return [dict(call, prompt=BATCH_PROMPTS[0]),
                dict(call, prompt=BATCH_PROMPTS[1], image=default_input_image().convert("RGBA"),
                     num_images_per_prompt=2)]

    def test_omni_returns_the_layers_in_order(self, ours, path):
        # Through Omni (the engine, step mode by default): `layers` RGBA images per output, output
        # 0's layers then output 1's, the images the pipeline makes in-process.
        from omnistage import Omni

        image = rgba_input_image()
        params = DiffusionParams(num_inference_steps=2, height=64, width=32, seed=3, num_outputs_per_prompt=2,
                                 extras={"layers": 3})
        with Omni(path) as omni:
            [out] = omni.generate({"prompt": "a red ball", "image": image}, params, use_tqdm=False)
        assert [(i.mode, i.size) for i in out.images] == [("RGBA", (32, 64))] * 6
        [payload] = ours.forward([DiffusionRequest("r", "a red ball", params, images=[image])])
        pairs = zip(out.images, payload.images, strict=True)
        assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)
        assert not np.array_equal(np.asarray(out.images[0]), np.asarray(out.images[1]))  # not one image repeated

    def test_default_size_is_diffusers(self, ours):
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_layered import calculate_dimensions

        image = default_input_image().resize((96, 48))
        request = ours.prepare_request(DiffusionRequest("r", "a ball", DiffusionParams(), images=[image]))
        assert (request.params.width, request.params.height) == calculate_dimensions(640 * 640, 2.0)
        assert request.params.extras == {"max_sequence_length": 512, "layers": 4, "resolution": 640,
                                         "cfg_normalize": False}
        assert (request.params.num_inference_steps, request.params.true_cfg_scale) == (50, 4.0)

    @pytest.mark.parametrize("field, prompt, params, images", [
        ("prompt", " ", DiffusionParams(height=64, width=64), [default_input_image()]),
        ("one input image", "a ball", DiffusionParams(height=64, width=64), [default_input_image()] * 2),
        ("resolution", "a ball", DiffusionParams(extras={"resolution": 512}), [default_input_image()]),
        ("layers", "a ball", DiffusionParams(height=64, width=64, extras={"layers": 0}), [default_input_image()]),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, prompt, params, images):
        assert_rejected(ours, field, params, images, prompt=prompt)
