"""FLUX.1-Kontext: our pipeline against diffusers' FluxKontextPipeline on the tiny zoo model
(fp32, CPU). The zoo call keeps the input image at its own size (`_auto_resize=False`);
`test_auto_resize_matches_diffusers` runs the default, a megapixel input image."""

from __future__ import annotations

import pytest

from parity import BATCH_PROMPTS, ParityTests, assert_rejected, max_abs_diff, request_for, run_arrays, TOLERANCE

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.flux.kontext_pipeline import FluxKontext
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image


class TestFluxKontext(ParityTests):
    zoo_name = "flux-kontext"
    reference_class = "FluxKontextPipeline"
    pipeline_class = FluxKontext
    staggered_short = {"true_cfg_scale": 2.0}  # the joining request alone runs true CFG

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        """The reference call: the zoo's defaults with the zoo's input image."""
        return dict(zoo_call_kwargs(cls.zoo_name), image=default_input_image())

    def request(self, call_kwargs, seed, request_id="req"):
        # We generate the size asked for: diffusers does when max_area is its area.
        kwargs = dict(call_kwargs)
        assert kwargs.pop("max_area") == kwargs["height"] * kwargs["width"]
        kwargs["auto_resize"] = kwargs.pop("_auto_resize", True)
        return request_for(kwargs, seed, request_id)

    def test_input_images_are_checked(self, ours):
        # The image is optional (Kontext also generates from text alone); two are refused.
        images = [default_input_image(), default_input_image()]
        assert_rejected(ours, "one input image", DiffusionParams(height=64, width=64), images)

    def test_batch_mixes_images_true_cfg_sizes_and_outputs(self, ours, expected, call):
        # True CFG for one; no input image (text to image) with two outputs for another; a
        # wide input image (its own token grid) and another output size for the third.
        wide = default_input_image().resize((96, 48))
        text_only = {k: v for k, v in call.items() if k != "image"}
        self.assert_batch_matches(ours, expected, [
            dict(call, prompt=BATCH_PROMPTS[0], true_cfg_scale=2.5),
            dict(text_only, prompt=BATCH_PROMPTS[1], num_images_per_prompt=2),
            dict(call, prompt=BATCH_PROMPTS[2], image=wide, height=32, width=64, max_area=32 * 64),
        ])

    def test_auto_resize_matches_diffusers(self, ours, expected, call):
        # The default: the 64x64 input image becomes 1024x1024 (Kontext's square resolution).
        call = dict(call, _auto_resize=True, num_inference_steps=2)
        (got,) = run_arrays(ours, [self.request(call, 5)])
        assert max_abs_diff(got, expected(call, 5)) <= TOLERANCE
        state, = ours.encode([ours.prepare_request(self.request(call, 5))])
        assert state.cond["image_size"] == ((1024 // 16) ** 2, 64)  # tokens, 16 channels packed 2x2

    def test_defaults(self, ours):
        side = 128 * 2 ** (len(ours.vae.config.block_out_channels) - 1)
        params = ours.prepare_params(DiffusionParams())
        assert (params.height, params.width, params.num_inference_steps, params.guidance_scale) == (side, side, 28, 3.5)
        assert params.extras == {"max_sequence_length": 512, "auto_resize": True}

    @pytest.mark.parametrize("field, params, images", [
        ("height", DiffusionParams(height=40, width=64), []),
        ("max_area", DiffusionParams(height=64, width=64, extras={"max_area": 4096}), []),
        ("image", DiffusionParams(height=64, width=64, extras={"auto_resize": False}),
         [default_input_image().resize((8, 64))]),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params, images):
        assert_rejected(ours, field, params, images)
