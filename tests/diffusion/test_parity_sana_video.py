"""SANA-Video: our SanaVideoT2V / SanaVideoI2V against diffusers' SanaVideoPipeline /
SanaImageToVideoPipeline on the tiny zoo models (fp32, CPU): alone, a batch of two, staggered."""

from __future__ import annotations

import pytest

from parity import BATCH_PROMPTS, ParityTests, assert_refused_at_load, assert_rejected, request_for

from omnistage.diffusion.params import DiffusionParams
from omnistage.models.sana_video.pipeline import SanaVideoI2V, SanaVideoT2V
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

T2V_CALL = zoo_call_kwargs("sana-video")
I2V_CALL = dict(zoo_call_kwargs("sana-video-i2v"), image=default_input_image(T2V_CALL["height"]))


def small(**fields) -> DiffusionParams:
    return DiffusionParams(**{"height": 64, "width": 64, "num_frames": 5, **fields})


class SanaVideoParity(ParityTests):
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    def request(self, call_kwargs, seed, request_id="req"):
        # diffusers' SANA-Video pipelines call the frame count `frames`.
        kwargs = dict(call_kwargs)
        return request_for(dict(kwargs, num_frames=kwargs.pop("frames")), seed, request_id)

    def batch_calls(self, call):
        # Two prompts of different lengths and seeds; CFG off for one, another negative prompt
        # and scale for the other.
        return [
            dict(call, prompt=BATCH_PROMPTS[0], guidance_scale=1.0),
            dict(call, prompt=BATCH_PROMPTS[1], negative_prompt="a dog", guidance_scale=3.0),
        ]


class TestSanaVideoT2V(SanaVideoParity):
    zoo_name = "sana-video"
    reference_class = "SanaVideoPipeline"
    pipeline_class = SanaVideoT2V

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return T2V_CALL

    def test_defaults_follow_diffusers(self, ours):
        params = ours.prepare_params(DiffusionParams())
        assert (params.height, params.width, params.num_frames, params.guidance_scale) == (480, 832, 81, 6.0)
        # No bins in the tiny checkpoint: binning is off by default and refused when asked for.
        assert params.extras == {"max_sequence_length": 300, "use_resolution_binning": False}

    @pytest.mark.parametrize("field, params", [
        ("height", small(height=48)),
        ("width", small(width=80)),
        ("num_frames", small(num_frames=6)),
        ("num_outputs_per_prompt", small(num_outputs_per_prompt=2)),
        ("guidance_scale_2", small(guidance_scale_2=3.0)),
        ("use_resolution_binning", small(extras={"use_resolution_binning": True})),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)

    def test_resolution_bins_of_a_480p_checkpoint(self):
        # sample_size 30: a 480x832 request is its own bin; a square one snaps to 624x624,
        # which is no whole 32-pixel block (diffusers refuses it too).
        from omnistage.diffusion.checkpoint import CheckpointConfigs

        configs = CheckpointConfigs({}, {"transformer": {"sample_size": 30}, "vae": {}})
        checker = SanaVideoT2V.for_requests(configs)
        assert checker.prepare_params(DiffusionParams()).extras["use_resolution_binning"] is True
        checker.prepare_request(request_for({"prompt": "a cat"}, 0))
        assert_rejected(checker, "height", DiffusionParams(height=480, width=480))


    @pytest.mark.parametrize("field", ["ulysses_degree", "ring_degree", "cache_backend"])
    def test_undeclared_accelerations_are_refused_by_name(self, path, field):
        # No sequence-parallel plan or step-cache block chain declared for its transformer.
        assert_refused_at_load(SanaVideoT2V, path, field)


class TestSanaVideoI2V(SanaVideoParity):
    zoo_name = "sana-video-i2v"
    reference_class = "SanaImageToVideoPipeline"
    pipeline_class = SanaVideoI2V

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return I2V_CALL

    def batch_calls(self, call):
        from PIL import Image

        first, second = super().batch_calls(call)
        return [first, dict(second, image=call["image"].transpose(Image.Transpose.FLIP_LEFT_RIGHT))]

    def test_rejects_two_images(self, ours):
        assert_rejected(ours, "image", small(), [default_input_image(), default_input_image()])
