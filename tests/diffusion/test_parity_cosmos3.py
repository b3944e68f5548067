"""Cosmos3: our Cosmos3 against diffusers' Cosmos3OmniPipeline on the tiny zoo model (fp32, CPU):
text-to-video alone and staggered, text-, image- and video-to-video mixed in one batch, and
video-to-video with its extras."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from parity import (
    BATCH_PROMPTS,
    TOLERANCE,
    BatchSeededParityTests,
    assert_refused_at_load,
    assert_rejected,
    load_reference,
    max_abs_diff,
    request_for,
    run_arrays,
)

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.cosmos3.pipeline import Cosmos3
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

CALL = zoo_call_kwargs("cosmos3")
SIDE = CALL["height"]
V2V_FRAMES = 9  # three latent frames: the default two pinned to the clip, one generated


def clip(shift: int, num_frames: int = V2V_FRAMES) -> list[Image.Image]:
    """A gradient panning `shift` pixels a frame."""
    base = np.asarray(default_input_image(2 * SIDE))
    return [Image.fromarray(base[:SIDE, i * shift:i * shift + SIDE].copy()) for i in range(num_frames)]


# An input image of another aspect ratio: diffusers resizes it to cover the frame and crops the middle.
I2V_CALL = dict(CALL, image=default_input_image(SIDE).resize((SIDE, SIDE // 2)))
V2V_CALL = dict(CALL, num_frames=V2V_FRAMES, video=clip(4))


def small(**fields) -> DiffusionParams:
    return DiffusionParams(**{"height": SIDE, "width": SIDE, "num_frames": 5, **fields})


class TestCosmos3(BatchSeededParityTests):
    zoo_name = "cosmos3"
    reference_class = "Cosmos3OmniPipeline"
    pipeline_class = Cosmos3
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        from diffusers import Cosmos3OmniPipeline

        # Its output names the frames `video`.
        pipe = load_reference(Cosmos3OmniPipeline, path)
        return lambda **kwargs: SimpleNamespace(frames=[pipe(**kwargs).video])

    def request(self, call_kwargs, seed, request_id="req"):
        # The conditioning clip travels as frames (the videos API's control_video).
        kwargs = dict(call_kwargs)
        video = kwargs.pop("video", None) or []
        return dataclasses.replace(request_for(kwargs, seed, request_id), video=video)

    def batch_calls(self, call):
        # Text-, image- and video-to-video in one batch (the first is also the alone, forward and
        # staggered tests' long request; the staggered short one runs without CFG): another
        # negative prompt and scale for the second, a longer clip for the third.
        return [
            dict(call, prompt=BATCH_PROMPTS[0]),
            dict(I2V_CALL, prompt=BATCH_PROMPTS[1], negative_prompt="a dog", guidance_scale=3.0),
            dict(V2V_CALL, prompt=BATCH_PROMPTS[2]),
        ]

    def test_video_to_video_extras_match_diffusers(self, ours, expected):
        # The clip's last frames, only the first latent frame pinned; no system prompt.
        call = dict(V2V_CALL, condition_video_keep="last", condition_frame_indexes_vision=[0],
                    use_system_prompt=False)
        (got,) = run_arrays(ours, [self.request(call, 5)])
        assert max_abs_diff(got, expected(call, 5)) <= TOLERANCE

    def test_defaults_follow_diffusers(self, ours):
        params = ours.prepare_params(DiffusionParams())
        assert (params.height, params.width, params.num_frames, params.fps, params.num_inference_steps,
                params.guidance_scale) == (720, 1280, 189, 24, 35, 6.0)
        assert params.extras == {"use_system_prompt": True, "add_resolution_template": True,
                                 "add_duration_template": True, "condition_frame_indexes_vision": [0, 1],
                                 "condition_video_keep": "first"}

    def test_input_images_are_checked(self, ours):
        # The input image is optional (image-to-video); two are refused.
        assert_rejected(ours, "image", small(), [default_input_image(), default_input_image()])

    @pytest.mark.parametrize("field, params, media", [
        ("height", small(height=40), {}),
        ("num_frames", small(num_frames=6), {}),
        ("num_outputs_per_prompt", small(num_outputs_per_prompt=2), {}),
        ("guidance_scale_2", small(guidance_scale_2=2.0), {}),
        ("video", small(), {"images": [default_input_image()], "video": clip(0, 5)}),
        ("image", small(num_frames=1), {"images": [default_input_image()]}),
        ("mask", small(), {"video": clip(0, 5), "mask": clip(0, 5)}),
        ("condition_frame_indexes_vision", small(extras={"condition_frame_indexes_vision": [2]}),
         {"video": clip(0, 5)}),
        ("condition_frame_indexes_vision", small(extras={"condition_frame_indexes_vision": []}),
         {"video": clip(0, 5)}),
        ("condition_video_keep", small(extras={"condition_video_keep": "middle"}), {}),
        ("enable_sound", small(extras={"enable_sound": True}), {}),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params, media):
        request = DiffusionRequest("r", "a cat", params, **media)
        with pytest.raises(ValueError, match=field):
            ours.prepare_request(request)

    @pytest.mark.parametrize("field", ["cache_backend", "ulysses_degree"])
    def test_undeclared_accelerations_are_refused_by_name(self, path, field):
        assert_refused_at_load(Cosmos3, path, field)
