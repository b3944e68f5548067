"""Wan-VACE: our WanVACE against diffusers' WanVACEPipeline on the tiny zoo model (fp32, CPU): a
control video with its mask and a reference image, alone, in a batch of two and staggered."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from PIL import Image

from parity import BATCH_PROMPTS, ParityTests, assert_refused_at_load, request_for

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.wan.vace import WanVACE
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

NUM_FRAMES = 5
SIDE = zoo_call_kwargs("wan-vace")["height"]


def control_video(shift: int) -> list[Image.Image]:
    """A gradient panning `shift` pixels a frame."""
    base = np.asarray(default_input_image(2 * SIDE))
    return [Image.fromarray(base[:SIDE, i * shift:i * shift + SIDE].copy()) for i in range(NUM_FRAMES)]


def mask_video() -> list[Image.Image]:
    """Keep the left half, regenerate the right half."""
    mask = np.zeros((SIDE, SIDE, 3), np.uint8)
    mask[:, SIDE // 2:] = 255
    return [Image.fromarray(mask)] * NUM_FRAMES


# A reference image of another aspect ratio (fitted onto a white canvas).
CALL = dict(zoo_call_kwargs("wan-vace"), num_frames=NUM_FRAMES, video=control_video(4), mask=mask_video(),
            reference_images=[default_input_image(SIDE).resize((SIDE, SIDE // 2))])


def small(**fields) -> DiffusionParams:
    return DiffusionParams(**{"height": SIDE, "width": SIDE, "num_frames": NUM_FRAMES, **fields})


class TestWanVACE(ParityTests):
    zoo_name = "wan-vace"
    reference_class = "WanVACEPipeline"
    pipeline_class = WanVACE
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return CALL

    def request(self, call_kwargs, seed, request_id="req"):
        # The control video and mask travel as frames, the reference images as input images.
        kwargs = dict(call_kwargs)
        media = {"video": kwargs.pop("video", None) or [], "mask": kwargs.pop("mask", None) or []}
        request = request_for(dict(kwargs, image=kwargs.pop("reference_images", None)), seed, request_id)
        return dataclasses.replace(request, **media)

    def batch_calls(self, call):
        # Another control video without a mask, another reference image and no CFG for the
        # second: both share each transformer call.
        return [
            dict(call, prompt=BATCH_PROMPTS[0]),
            dict(call, prompt=BATCH_PROMPTS[1], video=control_video(8), mask=None, guidance_scale=1.0,
                 reference_images=[default_input_image(SIDE).rotate(90)]),
        ]

    def test_the_control_steers_the_video(self, ours, expected, call):
        # Same prompt and seed, another control video and conditioning scale: another video (the
        # control blocks are not a no-op on the tiny model).
        from parity import max_abs_diff, run_arrays

        other = dict(call, video=control_video(8), conditioning_scale=0.5)
        (got,) = run_arrays(ours, [self.request(other, self.alone_seed)])
        assert max_abs_diff(got, expected(other, self.alone_seed)) <= 1e-3
        assert max_abs_diff(got, expected(call, self.alone_seed)) > 1e-2

    def test_input_images_are_checked(self, ours):
        # Reference images are optional: a text-only request is plain Wan T2V with control zeros.
        ours.prepare_request(self.request({"prompt": "a cat"}, 0))

    @pytest.mark.parametrize("field, media", [
        ("mask", {"mask": mask_video()}),  # a mask without a video
        ("video", {"video": control_video(4)[:3]}),
        ("video", {"video": [f.resize((SIDE, SIDE // 2)) for f in control_video(4)]}),
    ])
    def test_control_media_are_checked(self, ours, field, media):
        from omnistage.diffusion.request import DiffusionRequest

        with pytest.raises(ValueError, match=field):
            ours.prepare_request(DiffusionRequest("r", "a cat", small(), **media))

    def test_other_families_refuse_a_control_video(self, zoo):
        from omnistage.diffusion.checkpoint import CheckpointConfigs
        from omnistage.diffusion.request import DiffusionRequest
        from omnistage.models.wan.pipeline import WanT2V

        checker = WanT2V.for_requests(CheckpointConfigs.read(str(zoo("wan-t2v"))))
        with pytest.raises(ValueError, match="video"):
            checker.prepare_request(DiffusionRequest("r", "a cat", small(), video=control_video(4)))

    @pytest.mark.parametrize("field", ["ulysses_degree", "ring_degree", "cache_backend"])
    def test_undeclared_accelerations_are_refused_by_name(self, path, field):
        # No sequence-parallel plan for the VACE transformer; no block chain for the step caches.
        assert_refused_at_load(WanVACE, path, field)
