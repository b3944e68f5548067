"""Qwen2.5-Omni token2wav on the tiny zoo checkpoint: the DiT velocity with its step-invariant
inputs computed once gives the reference forward's numbers, bit for bit, guided or not."""

from __future__ import annotations

import pytest
import torch

from omnistage.models.qwen2_5_omni import Token2WavParams
from omnistage.models.qwen2_5_omni.dit_velocity import DiTVelocity

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def token2wav(zoo):
    from omnistage.models.qwen2_5_omni.token2wav import Token2Wav

    decoder = Token2Wav.load(str(zoo("qwen2.5-omni")), None, torch.device("cpu"), torch.float32, 1)
    yield decoder
    decoder.close()


@pytest.mark.parametrize("guidance_scale", [0.5, 0.0])
def test_dit_velocity_equals_the_reference_forward(token2wav, guidance_scale):
    dit, voice = token2wav.dit, token2wav.speakers["Ethan"]
    generator = torch.Generator().manual_seed(0)
    num_codes = 30  # 60 mel frames: two and a half DiT blocks
    codes = torch.randint(0, token2wav.num_codes, (1, num_codes), generator=generator)
    cond = voice["cond"].float()[None].unsqueeze(1).repeat(1, 2 * num_codes, 1)
    ref_mel = voice["ref_mel"].float()
    guided = guidance_scale > 0
    with torch.inference_mode():
        velocity = DiTVelocity(dit, codes, cond, token2wav.encoded_mels.encoded("Ethan", ref_mel, guided),
                               guidance_scale)
        for t in (0.0, 0.37, 1.0):
            x = torch.randn(1, 2 * num_codes, dit.mel_dim, generator=generator)
            out = dit(hidden_states=x, quantized_code=codes, speaker_embedding=cond, condition_vector=ref_mel,
                      time_step=torch.tensor(t), drop_audio_conditioning=False, drop_code=False, apply_cfg=guided)
            if guided:
                with_cfg, null = torch.chunk(out, 2, dim=0)
                out = with_cfg + (with_cfg - null) * guidance_scale
            assert torch.equal(velocity(torch.tensor(t), x), out)
        # The whole ODE: `sample` drawing its noise after the same seed.
        torch.manual_seed(7)
        noise = torch.randn(1, 2 * num_codes, dit.mel_dim)
        torch.manual_seed(7)
        ref = dit.sample(voice["cond"].float()[None], ref_mel, codes, num_steps=4, guidance_scale=guidance_scale)
        ours = token2wav._sample(codes, noise, "Ethan", Token2WavParams(num_steps=4, guidance_scale=guidance_scale))
    assert torch.equal(ours, ref)


def test_time_terms_cached_across_windows_keep_the_reference_numbers(token2wav):
    """The time embedding and AdaLN terms are cached per ODE time for every window and request:
    a window decoded after others filled the cache (other lengths, guided and not) still gives
    `dit.sample`'s mel bit for bit, and the cache holds one entry per distinct time and batch."""
    from omnistage.models.qwen2_5_omni.dit_velocity import TimeCache

    dit, voice = token2wav.dit, token2wav.speakers["Chelsie"]
    token2wav.time_terms = TimeCache(dit)  # start empty (the module's other tests filled it)
    generator = torch.Generator().manual_seed(1)
    ref_mel = voice["ref_mel"].float()
    with torch.inference_mode():
        for num_codes, guidance_scale in ((12, 0.5), (36, 0.5), (24, 0.0), (24, 0.5)):
            codes = torch.randint(0, token2wav.num_codes, (1, num_codes), generator=generator)
            torch.manual_seed(num_codes)
            noise = torch.randn(1, 2 * num_codes, dit.mel_dim)
            torch.manual_seed(num_codes)
            ref = dit.sample(voice["cond"].float()[None], ref_mel, codes, num_steps=5, guidance_scale=guidance_scale)
            params = Token2WavParams(num_steps=5, guidance_scale=guidance_scale)
            assert torch.equal(token2wav._sample(codes, noise, "Chelsie", params), ref), (num_codes, guidance_scale)
    # 5 time points: 4 intervals x 4 evaluations, 13 distinct times; batch 2 (guided) and 1.
    assert len(token2wav.time_terms._entries) == 2 * 13


@pytest.mark.parametrize("frames", [1, 34, 97])
def test_vocoder_pass_equals_the_reference_bigvgan(token2wav, frames):
    """`BigVGANPass` (SnakeBeta's exp terms once at load) gives BigVGAN's waveform bit for bit."""
    mel = torch.randn(1, token2wav.dit.mel_dim, frames, generator=torch.Generator().manual_seed(frames))
    with torch.inference_mode():
        ours = token2wav.vocoder(mel)
        ref = token2wav.model.code2wav_bigvgan_model(mel)
    assert ours.shape == ref.shape == (frames * token2wav.hop,)
    assert torch.equal(ours, ref)


def test_the_default_schedule_is_cached_at_load(token2wav):
    """A freshly loaded decoder already holds the default ODE schedule's time terms (28 times,
    guided), so the first request's first chunk computes none of them."""
    from omnistage.models.qwen2_5_omni.token2wav import Token2Wav

    fresh = Token2Wav(token2wav.model, token2wav.speakers, token2wav.device)
    assert len(fresh.time_terms._entries) == 28
    before = dict(fresh.time_terms._entries)
    codes = torch.randint(0, fresh.num_codes, (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        fresh._sample(codes, torch.randn(1, 48, fresh.dit.mel_dim), "Chelsie", Token2WavParams())
    assert fresh.time_terms._entries == before
