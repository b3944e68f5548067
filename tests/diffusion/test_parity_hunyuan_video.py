"""HunyuanVideo-1.5: our HunyuanVideo15T2V against diffusers' HunyuanVideo15Pipeline on the tiny
zoo model (fp32, CPU)."""

from __future__ import annotations

from typing import Any

import pytest

from parity import BATCH_PROMPTS, ParityTests, assert_rejected, load_reference, reference_outputs

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.hunyuan_video.pipeline import HunyuanVideo15T2V
from omnistage.testing.hunyuan_video_models import CALL_KWARGS

CALL = CALL_KWARGS["hunyuan-video"]


def small(**fields) -> DiffusionParams:
    return DiffusionParams(**{"height": 64, "width": 64, "num_frames": 9, **fields})


class GuiderCall:
    """diffusers' pipeline called with `guidance_scale`: its __call__ takes none (the scale is
    its guider's), so the call swaps in a guider with that scale for the call."""

    def __init__(self, pipe: Any):
        self.pipe = pipe

    def __call__(self, guidance_scale: float | None = None, **kwargs: Any) -> Any:
        from diffusers import ClassifierFreeGuidance

        guider = self.pipe.guider
        if guidance_scale is not None:
            self.pipe.guider = ClassifierFreeGuidance.from_config(guider.config, guidance_scale=guidance_scale)
        try:
            return self.pipe(**kwargs)
        finally:
            self.pipe.guider = guider


class TestHunyuanVideo15T2V(ParityTests):
    zoo_name = "hunyuan-video"
    reference_class = "HunyuanVideo15Pipeline"
    pipeline_class = HunyuanVideo15T2V
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return CALL

    @pytest.fixture(scope="class")
    @classmethod
    def expected(cls, reference):
        return reference_outputs(GuiderCall(reference))

    def batch_calls(self, call):
        # CFG off for one; another scale, negative prompt and a quoted glyph text (which the
        # ByT5 encoder reads) for one; fewer frames (its own transformer group) for one.
        return [
            dict(call, prompt=BATCH_PROMPTS[0], guidance_scale=1.0),
            dict(call, prompt=f'{BATCH_PROMPTS[1]} with a sign that says "hello"', negative_prompt="a dog",
                 guidance_scale=3.0),
            dict(call, prompt=BATCH_PROMPTS[2], num_frames=5),
        ]

    def test_defaults_come_from_the_checkpoint(self, ours):
        # The guider's scale; the target size's (64) bucket closest to 16:9; 24 fps.
        params = ours.prepare_params(DiffusionParams())
        assert params.guidance_scale == 6.0
        assert (params.height, params.width) == (48, 80)
        assert params.fps == 24 and params.num_frames == 121

    @pytest.mark.parametrize("field, params", [
        ("height", small(height=40)),
        ("width", small(width=72)),
        ("num_frames", small(num_frames=8)),
        ("num_outputs_per_prompt", small(num_outputs_per_prompt=2)),
        ("true_cfg_scale", small(true_cfg_scale=3.0)),
        ("guidance_scale_2", small(guidance_scale_2=3.0)),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)
