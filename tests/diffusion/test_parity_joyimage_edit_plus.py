"""JoyAI-Image-Edit-Plus: our pipeline against diffusers' JoyImageEditPlusPipeline on the tiny zoo
model (fp32, CPU), with two reference images of different sizes: alone, two in a batch (one
transformer call when prompts and references match) and staggered, and the default size from
the last reference.

diffusers resizes every reference to its ~1-megapixel bucket, whose VAE encode alone takes the
tiny model many seconds: `small_buckets` (the zoo's) has both sides bucket each image at its own
size (snapped to the patch grid) through that one function, `find_best_bucket`; the rest is theirs.
"""

from __future__ import annotations

import pytest

from parity import BATCH_PROMPTS, BatchSeededParityTests, assert_rejected, load_reference, max_abs_diff

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.joyimage.plus import JoyImageEditPlus
from omnistage.testing.joyimage_models import plus_references as references
from omnistage.testing.joyimage_models import small_buckets


class TestJoyImageEditPlus(BatchSeededParityTests):
    zoo_name = "joyai-image-edit-plus"
    reference_class = "JoyImageEditPlusPipeline"
    pipeline_class = JoyImageEditPlus
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def buckets(cls):
        with small_buckets():
            yield

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls, path):
        from omnistage.testing import call_kwargs

        return dict(call_kwargs(cls.zoo_name), image=references())

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        from diffusers import JoyImageEditPlusPipeline
        from transformers import Qwen3VLProcessor

        from omnistage.models.qwen_image.vl_processor import processor_from_parts

        pipe = load_reference(JoyImageEditPlusPipeline, path, processor=processor_from_parts(Qwen3VLProcessor, path))
        return lambda image, **kwargs: pipe(images=image, **kwargs)

    def batch_calls(self, call):
        # Prompts of different lengths over the same references: one call, the shorter padded and masked.
        return [dict(call, prompt=BATCH_PROMPTS[0]), dict(call, prompt=BATCH_PROMPTS[1])]

    def test_requests_with_equal_references_share_one_call(self, ours, call):
        calls = []
        hook = ours.transformer.register_forward_pre_hook(lambda module, args, kwargs: calls.append(
            len(kwargs["hidden_states"])), with_kwargs=True)
        requests = [self.request(dict(call, prompt=p, num_inference_steps=1), s, f"r{s}")
                    for s, p in zip((1, 2), BATCH_PROMPTS)]  # prompts of different lengths
        try:
            ours.denoise(requests)
        finally:
            hook.remove()
        assert calls == [4]  # both branches of both requests

    def test_default_size_is_the_last_references_bucket(self, ours, expected, call):
        sized = {k: v for k, v in call.items() if k not in ("height", "width")}
        (got,) = ours.decode_arrays(ours.denoise([self.request(sized, 5)]))
        want = expected(sized, 5)
        assert got.shape == want.shape == (1, 48, 96, 3)
        assert max_abs_diff(got, want) <= 1e-3

    @pytest.mark.parametrize("field, params, images", [
        ("image", DiffusionParams(height=64, width=64), []),
        ("num_outputs_per_prompt", DiffusionParams(height=64, width=64, num_outputs_per_prompt=2), references()),
        ("height", DiffusionParams(height=40, width=64), references()),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params, images):
        assert_rejected(ours, field, params, images, prompt="make it blue")
