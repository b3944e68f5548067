"""Kandinsky 6 TI2VA: our Kandinsky6TI2VA against diffusers' Kandinsky6TI2VAPipeline on the tiny
zoo model (fp32, CPU): the video and its soundtrack, text-to-video alone, in a batch of two and
staggered, and image-to-video; the soundtrack reaches the MP4 as an audio track."""

from __future__ import annotations

import numpy as np
import pytest

from parity import (
    BATCH_PROMPTS,
    BATCH_SEEDS,
    TOLERANCE,
    BatchSeededParityTests,
    assert_rejected,
    load_reference,
    max_abs_diff,
    SoundtrackFixtures,
)

from omnistage.core.types import VideoPayload
from omnistage.diffusion.params import DiffusionParams
from omnistage.media.video import decode_audio_track, encode_mp4
from omnistage.models.kandinsky6.pipeline import Kandinsky6TI2VA
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

# Two steps: the staggered test's short request is the batch's second call.
CALL = dict(zoo_call_kwargs("kandinsky6"), num_inference_steps=2)


def small(**fields) -> DiffusionParams:
    return DiffusionParams(**{"height": 64, "width": 64, "num_frames": 9, **fields})


class TestKandinsky6(SoundtrackFixtures, BatchSeededParityTests):
    zoo_name = "kandinsky6"
    reference_class = "Kandinsky6TI2VAPipeline"
    pipeline_class = Kandinsky6TI2VA

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return CALL

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        from diffusers import Kandinsky6TI2VAPipeline

        # The Qwen2_5_VLProcessor built from its halves, as our loader does (no torchvision here).
        return load_reference(Kandinsky6TI2VAPipeline, path, **Kandinsky6TI2VA.loader_kwargs(str(path)))

    def batch_calls(self, call):
        # CFG off for the second, with another frame rate (so another audio length: its own group).
        return [dict(call, prompt=BATCH_PROMPTS[0]),
                dict(call, prompt=BATCH_PROMPTS[1], guidance_scale=1.0, frame_rate=16.0)]

    def test_soundtrack_matches_diffusers(self, ours, reference_av, call):
        calls = self.batch_calls(call)
        states = ours.denoise([self.request(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, BATCH_SEEDS))])
        for (_, audio), c, s in zip(ours.decode_av(states), calls, BATCH_SEEDS):
            want = reference_av(c, s)[1]
            assert audio.shape == (1, *want.shape) and np.abs(want).max() > 1e-3  # mono, not silence
            assert max_abs_diff(audio[0], want) <= TOLERANCE

    def test_image_to_video_matches_diffusers(self, ours, reference_av, call):
        # The image is an extra token-type-1 frame; its latent is sampled before the noise.
        i2v = dict(call, prompt=BATCH_PROMPTS[0], image=default_input_image(64))
        (video, audio), = ours.decode_av(ours.denoise([self.request(i2v, BATCH_SEEDS[0])]))
        want_video, want_audio = reference_av(i2v, BATCH_SEEDS[0])
        assert max_abs_diff(video, want_video) <= TOLERANCE and max_abs_diff(audio[0], want_audio) <= TOLERANCE
        # The image changes the video (the same prompt and seed without it).
        assert max_abs_diff(video, reference_av(dict(call, prompt=BATCH_PROMPTS[0]), BATCH_SEEDS[0])[0]) > 1e-2

    def test_mp4_carries_the_soundtrack(self, ours, call):
        (payload,) = ours.forward([self.request(dict(call, prompt=BATCH_PROMPTS[0]), BATCH_SEEDS[0])])
        assert isinstance(payload, VideoPayload) and payload.sample_rate == 8000 and payload.audio.shape[0] == 1
        # As long as the video, about (the audio latents cover whole hops).
        assert abs(payload.audio.shape[1] / payload.sample_rate - payload.frames.shape[0] / payload.fps) < 0.05
        track = decode_audio_track(encode_mp4(payload.frames, payload.fps, audio=payload.audio,
                                              sample_rate=payload.sample_rate))
        assert track is not None and track[1] == 8000 and np.abs(track[0]).max() > 1e-3

    @pytest.mark.parametrize("field, params, images", [
        ("height", small(height=56), []),  # whole 16-pixel blocks (VAE 8x, patch 2)
        ("num_frames", small(num_frames=8), []),  # not on the VAE's 4-frame grid
        ("guidance_scale_2", small(guidance_scale_2=2.0), []),
        ("image", small(), [default_input_image(64), default_input_image(64)]),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params, images):
        assert_rejected(ours, field, params, images)

    def test_input_images_are_checked(self, ours):
        # The image is optional (text-to-video without one); what is given must be an image.
        assert_rejected(ours, "image", small(), [np.zeros((64, 64, 3), np.uint8)])
