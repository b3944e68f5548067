"""SANA-WM: our SanaWM against diffusers' SanaWMPipeline on the tiny zoo model (fp32, CPU): an
image and a camera path (an action string or explicit poses) alone, in a batch, staggered."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from PIL import Image

from parity import (
    BATCH_PROMPTS,
    BatchSeededParityTests,
    assert_refused_at_load,
    assert_rejected,
    load_reference,
    max_abs_diff,
    request_for,
    run_arrays,
)

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.sana_wm.pipeline import SanaWM
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

CALL = dict(zoo_call_kwargs("sana-wm"), image=default_input_image(zoo_call_kwargs("sana-wm")["height"]))


def strafe_poses(num_frames: int = 9) -> list:
    """Explicit poses (JSON-like lists) of the camera moving right, instead of an action string."""
    from diffusers.pipelines.sana_wm.cam_utils import action_string_to_c2w

    return action_string_to_c2w(f"d-{num_frames - 1}").tolist()


def small(**extras) -> DiffusionParams:
    fields = {"action": "w-8", "intrinsics": [50.0, 50.0, 32.0, 32.0], **extras}
    return DiffusionParams(height=64, width=64, num_frames=9, extras={k: v for k, v in fields.items() if v is not None})


class TestSanaWM(BatchSeededParityTests):
    zoo_name = "sana-wm"
    reference_class = "SanaWMPipeline"
    pipeline_class = SanaWM
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return CALL

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        from diffusers import SanaWMPipeline

        # Its `frames` are one video, not a batch of them.
        pipe = load_reference(SanaWMPipeline, path)
        return lambda **kwargs: SimpleNamespace(frames=[pipe(**kwargs).frames])

    def batch_calls(self, call):
        # Other prompts, images, camera paths (poses instead of an action string) and
        # intrinsics; another negative prompt and scale for one. The first is also the alone,
        # forward and staggered tests' long request (the staggered short one runs without CFG).
        wide = default_input_image(call["height"]).resize((2 * call["width"], call["height"]))
        return [
            dict(call, prompt=BATCH_PROMPTS[0]),
            dict(call, prompt=BATCH_PROMPTS[1], negative_prompt="a dog", guidance_scale=3.0, action=None,
                 c2w=strafe_poses(), image=call["image"].transpose(Image.Transpose.FLIP_LEFT_RIGHT)),
            dict(call, prompt=BATCH_PROMPTS[2], image=wide, intrinsics=[80.0, 60.0, 64.0, 32.0], action="il-8"),
        ]

    def request(self, call_kwargs, seed, request_id="req"):
        # A camera path left as None in the reference call is not given.
        return request_for({k: v for k, v in call_kwargs.items() if v is not None}, seed, request_id)

    def test_the_camera_path_steers_the_video(self, ours):
        # Same image, prompt and seed; another camera path gives another video.
        calls = [dict(CALL, action=action, num_inference_steps=2) for action in ("w-8", "jl-8")]
        forward, turn = run_arrays(ours, [self.request(call, 0, f"r{i}") for i, call in enumerate(calls)])
        assert max_abs_diff(forward, turn) > 1e-2

    def test_defaults_follow_diffusers(self, ours):
        params = ours.prepare_params(DiffusionParams())
        assert (params.height, params.width, params.num_frames, params.fps, params.num_inference_steps,
                params.guidance_scale) == (704, 1280, 161, 16, 60, 5.0)

    @pytest.mark.parametrize("field, params", [
        ("action", small(action=None)),  # no camera path
        ("action", small(c2w=strafe_poses())),  # two
        ("action", small(action="x-8")),
        ("c2w", small(action=None, c2w=[[1, 0], [0, 1]])),
        ("intrinsics", small(intrinsics=None)),
        ("intrinsics", small(intrinsics=[50.0, 50.0])),
        ("num_frames", small(action="w-4")),  # 5 poses for 9 frames
        ("num_frames", DiffusionParams(height=64, width=64, num_frames=8, extras=small().extras)),
        ("height", DiffusionParams(height=40, width=64, num_frames=9, extras=small().extras)),
        ("guidance_scale_2", DiffusionParams(height=64, width=64, num_frames=9, guidance_scale_2=2.0,
                                             extras=small().extras)),
        ("chi_prompt", small(chi_prompt=["be brief"])),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params, [default_input_image()])

    @pytest.mark.parametrize("field", ["cache_backend", "ulysses_degree"])
    def test_undeclared_accelerations_are_refused_by_name(self, path, field):
        assert_refused_at_load(SanaWM, path, field)
