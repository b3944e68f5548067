"""HunyuanVideo-1.5: our HunyuanVideo15T2V / HunyuanVideo15I2V against diffusers'
HunyuanVideo15Pipeline / HunyuanVideo15ImageToVideoPipeline on the tiny zoo models (fp32, CPU)."""

from __future__ import annotations

from typing import Any

import pytest

from parity import (
    BATCH_PROMPTS,
    BATCH_SEEDS,
    BatchSeededParityTests,
    assert_rejected,
    load_reference,
    reference_outputs,
    run_arrays,
)

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.hunyuan_video.pipeline import HunyuanVideo15I2V, HunyuanVideo15T2V
from omnistage.testing.diffusion_models import default_input_image
from omnistage.testing import call_kwargs as zoo_call_kwargs

CALL = zoo_call_kwargs("hunyuan-video")


def small(**fields) -> DiffusionParams:
    return DiffusionParams(**{"height": 64, "width": 64, "num_frames": 9, **fields})


class GuiderCall:
    """diffusers' pipeline called with `guidance_scale`: its __call__ takes none (the scale is
    its guider's), so each call gets a fresh copy of the guider with that scale. Fresh also
    because the pipeline decides whether to encode the negative prompt from the guider's step
    state, which a previous call leaves behind (wrong when start / stop are set)."""

    def __init__(self, pipe: Any):
        self.pipe = pipe

    def __call__(self, guidance_scale: float | None = None, **kwargs: Any) -> Any:
        from diffusers import ClassifierFreeGuidance

        guider = self.pipe.guider
        scale = {} if guidance_scale is None else {"guidance_scale": guidance_scale}
        self.pipe.guider = ClassifierFreeGuidance.from_config(guider.config, **scale)
        try:
            return self.pipe(**kwargs)
        finally:
            self.pipe.guider = guider


class TestHunyuanVideo15T2V(BatchSeededParityTests):
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

    @pytest.fixture(scope="class")
    @classmethod
    def guider_path(cls, path, tmp_path_factory):
        """The zoo model with another guider: the original formulation at scale 2, rescaled,
        CFG only on the middle half of the steps."""
        import json
        import shutil

        out = tmp_path_factory.mktemp("hunyuan-video-guider") / "model"
        shutil.copytree(path, out)
        config = out / "guider" / "guider_config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "guidance_scale": 2.0, "guidance_rescale": 0.7,
                                      "use_original_formulation": True, "start": 0.25, "stop": 0.75}))
        return out

    def test_the_guider_config_sets_the_cfg_rule(self, guider_path, call):
        from diffusers import HunyuanVideo15Pipeline

        ours = HunyuanVideo15T2V.from_pretrained(guider_path)
        assert ours.prepare_params(DiffusionParams()).guidance_scale == 2.0
        expected = reference_outputs(GuiderCall(load_reference(HunyuanVideo15Pipeline, guider_path)))
        (state,) = ours.denoise([self.request(call, 0)])
        assert state.num_forwards == 4 + 2  # the uncond branch ran on steps 1 and 2 of 4
        self.assert_batch_matches(ours, expected, [call, dict(call, prompt=BATCH_PROMPTS[1], guidance_scale=4.0)],
                                  BATCH_SEEDS[:2])

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


def i2v_call(**overrides) -> dict:
    return dict(zoo_call_kwargs("hunyuan-video-i2v"), image=default_input_image(), **overrides)


class TestHunyuanVideo15I2V(BatchSeededParityTests):
    zoo_name = "hunyuan-video-i2v"
    reference_class = "HunyuanVideo15ImageToVideoPipeline"
    pipeline_class = HunyuanVideo15I2V
    staggered_short = {"guidance_scale": 1.0}

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return i2v_call()

    @pytest.fixture(scope="class")
    @classmethod
    def expected(cls, reference):
        return reference_outputs(GuiderCall(reference))

    def batch_calls(self, call):
        # Different images, one of them wide (another size bucket, so its own transformer
        # group); CFG off for one.
        from PIL import Image

        image = call["image"]
        return [
            dict(call, prompt=BATCH_PROMPTS[0], image=image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)),
            dict(call, prompt=BATCH_PROMPTS[1], image=image.resize((128, 48))),
            dict(call, prompt=BATCH_PROMPTS[2], image=image.rotate(90), guidance_scale=1.0),
        ]

    def test_the_video_takes_the_image_aspect_ratio(self, ours, expected, call):
        wide = self.batch_calls(call)[1]  # the batch test's wide request: its reference run is shared
        assert wide["image"].width > wide["image"].height
        (got,) = run_arrays(ours, [self.request(wide, BATCH_SEEDS[1])])
        assert got.shape == expected(wide, BATCH_SEEDS[1]).shape and got.shape[1] < got.shape[2]

    @pytest.mark.parametrize("field", ["height", "width"])
    def test_a_size_is_refused(self, ours, field):
        params = DiffusionParams(num_frames=9, **{field: 64})
        assert_rejected(ours, field, params, [default_input_image()])
