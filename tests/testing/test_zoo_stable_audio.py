"""The Stable Audio zoo model: registered in both sizes, loaded by diffusers' own
StableAudioPipeline, real (finite, varying) stereo audio, a byte-for-byte deterministic build."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from omnistage.testing import build, get_model
from omnistage.testing import call_kwargs as zoo_call_kwargs


def load(path):
    from diffusers import StableAudioPipeline

    pipe = StableAudioPipeline.from_pretrained(str(path))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_registered_in_both_sizes_with_call_defaults():
    model = get_model("stable-audio")
    assert (model.kind, model.reference_class, model.sizes) == ("diffusion", "diffusers.StableAudioPipeline",
                                                                ("tiny", "small"))
    assert zoo_call_kwargs("stable-audio")["audio_end_in_s"] == 0.5


def test_tiny_generates_stereo_audio(zoo):
    pipe = load(zoo("stable-audio"))
    call = zoo_call_kwargs("stable-audio")
    audio = pipe(**call, generator=torch.Generator("cpu").manual_seed(0), output_type="np").audios
    assert audio.shape == (1, 2, int(call["audio_end_in_s"] * pipe.vae.config.sampling_rate))
    assert np.isfinite(audio).all() and audio.std() > 0


def test_small_loads_with_millions_of_parameters(zoo):
    pipe = load(zoo("stable-audio", size="small"))
    num_params = sum(p.numel() for p in pipe.transformer.parameters())
    assert 500_000 < num_params < 10_000_000
    window = pipe.transformer.config.sample_size * pipe.vae.hop_length / pipe.vae.config.sampling_rate
    assert window == 4.096


def test_build_is_deterministic(zoo, tmp_path):
    def digests(folder):  # `.complete` is the cache's own marker (zoo.ensure), not part of a build
        return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".complete"}

    # The seed-0 build the session's cache holds (zoo.ensure ran `build`) against a fresh one.
    assert digests(zoo("stable-audio")) == digests(build("stable-audio", tmp_path / "b"))
