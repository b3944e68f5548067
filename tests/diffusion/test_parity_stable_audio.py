"""Stable Audio: our pipeline against diffusers' StableAudioPipeline on the tiny zoo model (fp32, CPU).

The reference's output is the waveform (`.audios`, [1, channels, samples]), not an image in
[0, 1], so `expected` reads that; everything else is the shared ParityTests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity import BATCH_PROMPTS, ParityTests, assert_rejected

from omnistage.core.types import AudioPayload
from omnistage.diffusion.params import DiffusionParams
from omnistage.models.stable_audio.pipeline import StableAudio
from omnistage.testing import call_kwargs as zoo_call_kwargs


def audio_params(**fields) -> DiffusionParams:
    return DiffusionParams(num_inference_steps=2, **fields)


class StableAudioParity(ParityTests):
    """The shared parity tests, reading the reference's waveforms (not collected itself)."""

    zoo_name = "stable-audio"
    reference_class = "StableAudioPipeline"
    pipeline_class = StableAudio
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs without CFG

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return zoo_call_kwargs("stable-audio")

    @pytest.fixture(scope="class")
    @classmethod
    def expected(cls, reference):
        cache: dict = {}

        def get(call_kwargs, seed):
            key = (seed, tuple(sorted(call_kwargs.items())))
            if key not in cache:
                out = reference(**call_kwargs, generator=torch.Generator("cpu").manual_seed(seed), output_type="np")
                cache[key] = np.asarray(out.audios)
            return cache[key]

        return get

    def batch_calls(self, call):
        # CFG without a negative prompt (zero uncond conditioning), CFG off, and other seconds.
        return [
            dict(call, prompt=BATCH_PROMPTS[0], negative_prompt=None),
            dict(call, prompt=BATCH_PROMPTS[1], guidance_scale=1.0, audio_end_in_s=0.8),
            dict(call, prompt=BATCH_PROMPTS[2], negative_prompt="noise", audio_start_in_s=0.25, audio_end_in_s=1.0),
        ]

    def test_forward_returns_the_decoded_output(self, ours, expected, call):
        # The payload is the float waveform as [samples, channels] at the VAE's rate.
        want = expected(call, self.alone_seed)
        (payload,) = ours.forward([self.request(call, self.alone_seed)])
        assert isinstance(payload, AudioPayload) and payload.sample_rate == ours.vae.config.sampling_rate
        assert payload.audio.dtype == np.float32 and payload.audio.shape == want[0].T.shape
        assert np.abs(payload.audio - want[0].T).max() <= 1e-3
        assert len(payload.audio) == int(call["audio_end_in_s"] * payload.sample_rate)



class TestStableAudio(StableAudioParity):
    """The zoo's scheduler: EDM DPM-Solver++ (SDE), the class the pipeline declares."""

    def test_defaults_come_from_the_checkpoint(self, ours):
        # StableAudioPipeline: the whole window (sample_size latent frames times the hop length).
        params = ours.prepare_params(DiffusionParams())
        window = ours.transformer.config.sample_size * ours.vae.hop_length / ours.vae.config.sampling_rate
        assert (params.num_inference_steps, params.guidance_scale) == (100, 7.0)
        assert params.extras == {"audio_start_in_s": 0.0, "audio_end_in_s": window}

    def test_default_duration_is_the_whole_window(self, ours, expected, call):
        call = {k: v for k, v in call.items() if k != "audio_end_in_s"}
        (got,) = ours.decode_arrays(ours.denoise([self.request(call, 5)]))
        want = expected(call, 5)
        assert got.shape == want.shape == (1, 2, ours.transformer.config.sample_size * ours.vae.hop_length)
        assert np.abs(got - want).max() <= 1e-3

    @pytest.mark.parametrize("field, params", [
        ("audio_end_in_s", audio_params(extras={"audio_end_in_s": 2.0})),  # longer than the 1.024 s window
        ("audio_end_in_s", audio_params(extras={"audio_start_in_s": 0.5, "audio_end_in_s": 0.5})),
        ("audio_start_in_s", audio_params(extras={"audio_start_in_s": -1.0})),
        ("height", audio_params(height=64)),
        ("num_outputs_per_prompt", audio_params(num_outputs_per_prompt=2)),
        ("partial_images", audio_params(partial_images=1)),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)


class TestStableAudioCosineScheduler(StableAudioParity):
    """The real Stable Audio Open checkpoint's scheduler, CosineDPMSolverMultistepScheduler:
    its noise comes from a Brownian tree seeded with the generator's seed (torchsde), so each
    request's own generator must reach its own scheduler."""

    @pytest.fixture(scope="class")
    @classmethod
    def path(cls, zoo, tmp_path_factory):
        import json
        import shutil

        pytest.importorskip("torchsde")
        from diffusers import CosineDPMSolverMultistepScheduler

        path = tmp_path_factory.mktemp("stable-audio-cosine") / "m"
        shutil.copytree(zoo(cls.zoo_name), path)
        shutil.rmtree(path / "scheduler")
        # Stable Audio Open 1.0's scheduler_config.json (its values are this class's defaults).
        CosineDPMSolverMultistepScheduler(sigma_min=0.3, sigma_max=500, solver_order=2,
                                          prediction_type="v_prediction", sigma_data=1.0,
                                          sigma_schedule="exponential").save_pretrained(path / "scheduler")
        index = json.loads((path / "model_index.json").read_text())
        index["scheduler"] = ["diffusers", "CosineDPMSolverMultistepScheduler"]
        (path / "model_index.json").write_text(json.dumps(index))
        return path

    def test_uses_the_cosine_scheduler(self, ours):
        assert type(ours.noise_scheduler).__name__ == "CosineDPMSolverMultistepScheduler"
