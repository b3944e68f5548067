"""LTX-2: our LTX2T2V against diffusers' LTX2Pipeline on the tiny zoo model (fp32, CPU), the video
and its soundtrack, alone, in a batch of three and staggered, with diffusers' guidance
defaults (CFG, STG, modality isolation, rescale) on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity import (
    BATCH_PROMPTS,
    BATCH_SEEDS,
    TOLERANCE,
    ParityTests,
    assert_rejected,
    av_request,
    max_abs_diff,
    run_staggered,
)

from omnistage.core.types import VideoPayload
from omnistage.diffusion.params import DiffusionParams
from omnistage.models.ltx2.pipeline import LTX2T2V
from omnistage.testing import call_kwargs as zoo_call_kwargs


def small(**fields) -> DiffusionParams:
    return DiffusionParams(**{"height": 64, "width": 64, "num_frames": 9, **fields})


class TestLTX2(ParityTests):
    zoo_name = "ltx2"
    reference_class = "LTX2Pipeline"
    pipeline_class = LTX2T2V

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return zoo_call_kwargs("ltx2")

    @pytest.fixture(scope="class")
    @classmethod
    def expected_audio(cls, reference):
        """The reference soundtrack [channels, samples] for (call, seed), computed once each."""
        cache: dict = {}

        def get(call, seed):
            key = (seed, tuple(sorted((k, str(v)) for k, v in call.items())))
            if key not in cache:
                out = reference(**call, generator=torch.Generator("cpu").manual_seed(seed), output_type="np")
                cache[key] = out.audio[0].numpy()
            return cache[key]

        return get

    def request(self, call_kwargs, seed, request_id="req"):
        return av_request(call_kwargs, seed, request_id)

    def batch_calls(self, call):
        # CFG off for one (video and audio), another negative prompt with STG off and fewer
        # frames (its own group) for one, a different frame rate for the third.
        return [
            dict(call, prompt=BATCH_PROMPTS[0], guidance_scale=1.0, audio_guidance_scale=1.0),
            dict(call, prompt=BATCH_PROMPTS[1], negative_prompt="a dog", stg_scale=0.0, audio_stg_scale=0.0,
                 num_frames=5),
            dict(call, prompt=BATCH_PROMPTS[2], frame_rate=12.0, modality_scale=1.0, audio_modality_scale=1.0),
        ]

    # -- the soundtrack -------------------------------------------------------------------------

    def test_audio_alone_matches_diffusers(self, ours, expected_audio, call):
        (_, audio), = ours.decode_av(ours.denoise([self.request(call, self.alone_seed)]))
        want = expected_audio(call, self.alone_seed)
        assert audio.shape == want.shape and audio.shape[0] == 2  # stereo
        assert np.abs(want).max() > 1e-3  # a real signal, not silence
        assert max_abs_diff(audio, want) <= TOLERANCE

    def test_audio_batch_and_staggered_match_diffusers(self, ours, expected_audio, call):
        calls = self.batch_calls(call)
        states = ours.denoise([self.request(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, BATCH_SEEDS))])
        for (_, audio), c, s in zip(ours.decode_av(states), calls, BATCH_SEEDS):
            assert max_abs_diff(audio, expected_audio(c, s)) <= TOLERANCE
        # Step mode: a 2-step request joins a 4-step one after its second step.
        long_call = dict(call, prompt=BATCH_PROMPTS[0], num_inference_steps=4)
        short_call = dict(call, prompt=BATCH_PROMPTS[1], num_inference_steps=2)
        first, second = self.request(long_call, 1, "long"), self.request(short_call, 2, "short")
        states = ours.encode([ours.prepare_request(first)])
        for _ in range(2):
            ours.denoise_step(states)
        states += ours.encode([ours.prepare_request(second)])
        while any(not s.is_done for s in states):
            ours.denoise_step([s for s in states if not s.is_done])
        for (_, audio), c, s in zip(ours.decode_av(states), (long_call, short_call), (1, 2)):
            assert max_abs_diff(audio, expected_audio(c, s)) <= TOLERANCE

    def test_payload_carries_the_soundtrack(self, ours, call):
        (payload,) = ours.forward([self.request(call, self.alone_seed)])
        assert isinstance(payload, VideoPayload) and payload.sample_rate == 16000
        assert payload.audio.dtype == np.float32 and payload.audio.shape[0] == 2
        # The vocoder makes one mel hop of samples per mel frame: about as long as the video.
        video_s, audio_s = payload.frames.shape[0] / payload.fps, payload.audio.shape[1] / payload.sample_rate
        assert abs(audio_s - video_s) < 0.1

    def test_each_guidance_pass_runs_once_per_step(self, ours, call):
        # CFG (cond + uncond rows), STG and modality isolation: 4 forwards a step; none off: 1.
        guided, plain = (self.request(call, 0, "g"),
                         self.request(dict(call, guidance_scale=1.0, audio_guidance_scale=1.0, stg_scale=0.0,
                                           audio_stg_scale=0.0, modality_scale=1.0, audio_modality_scale=1.0),
                                      0, "p"))
        states = ours.denoise([guided, plain])
        assert [s.num_forwards for s in states] == [4 * call["num_inference_steps"], call["num_inference_steps"]]

    def test_staggered_with_different_stg_blocks(self, ours, expected, call):
        # Requests that perturb different blocks share a step but not their STG call.
        long_call = dict(call, prompt=BATCH_PROMPTS[0], num_inference_steps=4, spatio_temporal_guidance_blocks=[0])
        short_call = dict(call, prompt=BATCH_PROMPTS[1], num_inference_steps=2)
        got = run_staggered(ours, self.request(long_call, 1, "long"), self.request(short_call, 2, "short"), 2)
        assert max_abs_diff(got[0], expected(long_call, 1)) <= TOLERANCE
        assert max_abs_diff(got[1], expected(short_call, 2)) <= TOLERANCE

    # -- input checks ---------------------------------------------------------------------------

    @pytest.mark.parametrize("field, params", [
        ("height", small(height=48)),  # diffusers needs multiples of 32
        ("width", small(width=80)),
        ("num_frames", small(num_frames=8)),  # not on the VAE's 2-frame grid
        ("num_outputs_per_prompt", small(num_outputs_per_prompt=2)),
        ("true_cfg_scale", small(true_cfg_scale=2.0)),
        ("stg_block", small(extras={"stg_block": 2})),  # the zoo transformer has blocks 0 and 1
        ("stg_scale", small(extras={"stg_scale": -1.0})),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)
