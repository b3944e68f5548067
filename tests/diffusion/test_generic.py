"""The generic adapter: any diffusers pipeline through its own __call__, one request at a time.

Served here on the tiny Z-Image zoo model (as if ZImagePipeline had no native class).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity import TOLERANCE, ReferenceFixtures, av_request, max_abs_diff, request_for

from omnistage.core.types import VideoPayload
from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.registry import pipeline_class
from omnistage.diffusion.request import DiffusionRequest
from omnistage.diffusion.generic import GenericDiffusersPipeline
from omnistage.models.z_image.pipeline import ZImage
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image


class TestGeneric(ReferenceFixtures):
    zoo_name = "z-image"
    reference_class = "ZImagePipeline"
    pipeline_class = GenericDiffusersPipeline

    def test_unknown_class_falls_back_to_generic(self):
        assert pipeline_class("SomeOtherDiffusersPipeline") is GenericDiffusersPipeline
        assert GenericDiffusersPipeline.max_batch_size == 1 and ZImage.max_batch_size is None

    def test_matches_diffusers(self, ours, expected, call):
        want = expected(call, 3)
        request = ours.prepare_request(request_for(call, seed=3))
        assert max_abs_diff(ours.generate_array(request), want) <= TOLERANCE
        # forward returns the same images as uint8 payloads.
        (payload,) = ours.forward([request_for(call, seed=3)])
        got = np.asarray(payload.images[0], dtype=np.float64) / 255
        assert np.abs(got - want[0]).max() <= 1 / 255 + 1e-6

    def test_maps_params_to_call_kwargs(self, ours, call):
        request = ours.prepare_request(request_for(dict(call, num_images_per_prompt=2), seed=7))
        kwargs = ours.call_kwargs(request)
        assert kwargs["num_images_per_prompt"] == 2 and kwargs["max_sequence_length"] == call["max_sequence_length"]
        assert kwargs["output_type"] == "np" and kwargs["generator"].initial_seed() == 7
        assert {k: kwargs[k] for k in ("prompt", "negative_prompt", "height", "guidance_scale")} == {
            k: call[k] for k in ("prompt", "negative_prompt", "height", "guidance_scale")}

    def test_defaults_and_extras_come_from_the_call_signature(self, ours):
        assert ours.reference_class == "ZImagePipeline"
        assert ours.default_params == {"num_inference_steps": 50, "guidance_scale": 5.0}
        assert {"max_sequence_length", "cfg_normalization", "cfg_truncation"} <= set(ours.extras)
        assert "output_type" not in ours.extras and "prompt" not in ours.extras

    def test_reports_progress_each_step(self, ours, call):
        seen = []
        ours.forward([request_for(dict(call, num_inference_steps=2), seed=1)],
                     on_step=lambda states: seen.append((states[0].step_index, states[0].num_steps)))
        assert seen == [(1, 2), (2, 2)]

    def test_steps_diffusers_call_one_step_at_a_time(self, ours, expected, call):
        # The call pauses after every step: each denoise_step advances exactly one.
        (state,) = ours.encode([ours.prepare_request(request_for(dict(call, num_inference_steps=3), seed=3))])
        steps = []
        while not state.is_done:
            ours.denoise_step([state])
            steps.append((state.step_index, state.num_steps))
        assert steps == [(1, 3), (2, 3), (3, 3)]
        (got,) = ours.decode_arrays([state])
        assert max_abs_diff(got, expected(dict(call, num_inference_steps=3), 3)) <= TOLERANCE

    def test_release_ends_the_call_at_its_next_step(self, ours, call):
        (state,) = ours.encode([ours.prepare_request(request_for(dict(call, num_inference_steps=50), seed=0))])
        ours.denoise_step([state])
        call_thread = state.cond["call"]._thread
        ours.release(state)  # an abort: the paused call unwinds instead of running 49 more steps
        assert not call_thread.is_alive() and state.cond["call"].result is None

    def test_one_request_per_forward(self, ours, call):
        with pytest.raises(ValueError, match="one request at a time"):
            ours.forward([request_for(call, seed=0, request_id="a"), request_for(call, seed=1, request_id="b")])

    def test_unknown_extra_is_rejected(self, ours):
        with pytest.raises(ValueError, match="not_an_argument"):
            ours.prepare_request(DiffusionRequest("r", "a cat", DiffusionParams(extras={"not_an_argument": 1})))

    def test_field_the_pipeline_does_not_take_is_rejected(self, ours):
        with pytest.raises(ValueError, match="true_cfg_scale"):
            ours.prepare_request(DiffusionRequest("r", "a cat", DiffusionParams(true_cfg_scale=2.0)))

    def test_input_image_is_rejected_for_text_to_image(self, ours):
        request = DiffusionRequest("r", "a cat", DiffusionParams(), images=[default_input_image()])
        with pytest.raises(ValueError, match="image"):
            ours.prepare_request(request)


class TestGenericEdit(ReferenceFixtures):
    """An edit pipeline through the adapter (FLUX.1-Kontext, as if it had no native class): the
    input image reaches diffusers' `image` and the output equals diffusers' own."""

    zoo_name = "flux-kontext"
    reference_class = "FluxKontextPipeline"
    pipeline_class = GenericDiffusersPipeline

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return dict(zoo_call_kwargs(cls.zoo_name), image=default_input_image())

    def test_edit_matches_diffusers(self, ours, expected, call):
        assert ours.needs_image
        (payload,) = ours.forward([request_for(call, seed=3)])
        got = np.asarray(payload.images[0], dtype=np.float64) / 255
        assert np.abs(got - expected(call, 3)[0]).max() <= 1 / 255 + 1e-6


class TestGenericVideoWithSound(ReferenceFixtures):
    """A video pipeline with a soundtrack through the adapter (LTX-2, as if LTX2Pipeline had no
    native class): the frames and the soundtrack equal diffusers', and the payload carries the
    soundtrack at the vocoder's rate and the video at diffusers' frame_rate."""

    zoo_name = "ltx2"
    reference_class = "LTX2Pipeline"
    pipeline_class = GenericDiffusersPipeline

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        call = dict(zoo_call_kwargs(cls.zoo_name))
        call.pop("spatio_temporal_guidance_blocks")  # a list, not an extra the adapter takes: diffusers' default
        return call

    def test_frames_and_soundtrack_match_diffusers(self, ours, reference, call):
        want = reference(**call, generator=torch.Generator("cpu").manual_seed(3), output_type="np")
        (payload,) = ours.forward([av_request(call, seed=3)])  # the adapter's fps is diffusers' frame_rate
        assert isinstance(payload, VideoPayload) and payload.fps == call["frame_rate"]
        frames = np.asarray(payload.frames, dtype=np.float64) / 255
        assert np.abs(frames - want.frames[0]).max() <= 1 / 255 + 1e-6
        assert payload.sample_rate == reference.vocoder.config.output_sampling_rate
        assert payload.audio is not None and max_abs_diff(payload.audio, want.audio[0].numpy()) <= TOLERANCE
