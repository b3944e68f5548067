"""Qwen2.5-Omni token2wav as a generation-engine decoder: codec frames -> 24 kHz waveform.

Token2wav is a DiT that samples a mel spectrogram from noise by flow matching (Runge-Kutta
4 over `num_steps` time points, with classifier-free guidance), conditioned on the codes,
the voice's speaker embedding and its reference mel; BigVGAN then turns the mel into audio.
Each code becomes `repeats` (2) mel frames, each mel frame `prod(upsample_rates)` (240)
samples: 480 samples per code, 50 codes per second at 24 kHz.

One engine request is one chunk of the talker's output (see `processors.talker_chunks`):
the codes of a window of the utterance and `ChunkOptions` saying which frames of it to
voice. Per chunk:

1. the DiT samples the window's mel from the utterance's own noise: rows
   [offset, offset + len) of the noise a one-shot decode of the whole utterance would draw
   (`randn(1, 2 * frames, 80)` after seeding; the CPU generator fills it row by row, so a
   prefix of a longer draw equals a shorter draw);
2. BigVGAN voices the chunk's mel frames plus `vocoder_halo` frames on each side (its
   receptive field, measured once at load), and the chunk's samples are cut out.

The DiT's attention is block-local per layer (blocks of `block_size` mel frames, with one
block of look-back or look-ahead in some layers), but every ODE step widens its reach, so
a chunked decode approximates the one-shot one; its windows must start on a block. A
single chunk holding the whole utterance is exactly the reference `Qwen2_5OmniToken2WavModel`
forward (same ops, same noise). Rows of a batch are decoded one by one: the DiT has no
padding mask, and windows differ in length.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from omnistage.generation.decoder import Decoder
from omnistage.models.qwen2_5_omni.dit_velocity import GUIDANCE_OFF, DiTVelocity, SpeakerCache, TimeCache
from omnistage.models.qwen2_5_omni.params import Token2WavParams
from omnistage.models.qwen2_5_omni.processors import DEFAULT_VOICE, ChunkOptions
from omnistage.models.qwen2_5_omni.vocoder import BigVGANPass
from omnistage.models.qwen2_5_omni.weights import load_speakers, load_token2wav
from omnistage.models.qwen_omni.handoff import check_voice

SAMPLE_RATE = 24000  # a fact of the released model that its config does not store


class Token2Wav(Decoder):
    supports_prepacked_linears = True  # the DiT's and BigVGAN's code only calls their linears
    sample_rate = SAMPLE_RATE
    chunk_frames = None  # a request is one window: decoded in one pass

    def __init__(self, model, speakers: dict, device: torch.device) -> None:
        self.model = model
        self.dit = model.code2wav_dit_model
        self.vocoder = BigVGANPass(model.code2wav_bigvgan_model)  # the model's forward, its constants once
        self.speakers = speakers
        self.encoded_mels = SpeakerCache(self.dit)
        self.time_terms = TimeCache(self.dit)
        self.device = device
        dit_config = self.dit.config
        self.repeats = dit_config.repeats
        self.block_size = dit_config.block_size
        self.num_codes = dit_config.num_embeds + 1  # the DiT's code embedding rows
        self.max_window = dit_config.max_position_embeddings // self.repeats
        self.hop = math.prod(model.config.bigvgan_config.upsample_rates)
        self.vocoder_halo = self._measure_vocoder_halo()
        self._warm_time_terms(Token2WavParams())

    def _warm_time_terms(self, params: Token2WavParams) -> None:
        """Fill the time cache for `params`' ODE schedule with one small window at load, so the first
        request's first chunk does not pay for it (later windows and requests read it)."""
        if not self.speakers:
            return
        codes = torch.zeros(1, max(1, self.block_size // self.repeats), dtype=torch.long, device=self.device)
        noise = torch.zeros(1, self.repeats * codes.shape[1], self.dit.mel_dim, device=self.device)
        self._sample(codes, noise, next(iter(self.speakers)), params)

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype, max_streams: int) -> Token2Wav:
        return cls(load_token2wav(model_path, device), load_speakers(model_path), device)

    def parse(self, codes: Any) -> torch.Tensor:
        """1-D codec ids in [0, num_embeds]."""
        t = codes if torch.is_tensor(codes) else torch.as_tensor(codes)
        if t.numel() == 0:
            t = t.long()  # `[]` reads as float
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.ndim != 1:
            raise ValueError(f"token2wav codes must be a 1-D integer sequence, got {t.dtype} {tuple(t.shape)}")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.num_codes):
            raise ValueError(f"token2wav codes must be in [0, {self.num_codes}), got [{int(t.min())}, {int(t.max())}]")
        return t.to(self.device)

    def open_stream(self, options: ChunkOptions | None = None) -> ChunkOptions | None:
        if options is not None:
            check_voice(self.speakers, options.voice)
        return options

    # --- the pass --------------------------------------------------------------------------------

    @torch.inference_mode()
    def decode(self, codes: list[torch.Tensor], states: list[ChunkOptions | None]) -> list[np.ndarray]:
        return [self._voice(c, opts) for c, opts in zip(codes, states)]

    def _voice(self, codes: torch.Tensor, opts: ChunkOptions | None) -> np.ndarray:
        n = codes.shape[0]
        if opts is None:  # plain codes: the whole utterance, default voice, a fresh seed
            seed = int(torch.randint(0, 2**62, ()).item())
            opts = ChunkOptions(0, 0, n, DEFAULT_VOICE, seed, Token2WavParams())
        if n == 0 or opts.end <= opts.start:
            return np.zeros(0, dtype=np.float32)
        if (opts.offset * self.repeats) % self.block_size:
            raise ValueError(f"a chunk window starts at codec frame {opts.offset}, inside a DiT block of "
                             f"{self.block_size // self.repeats} frames: chunk_size and left_context must be "
                             "multiples of it")
        if n > self.max_window:  # positions restart at each window: only its length counts
            raise ValueError(f"a token2wav window of {n} codec frames is longer than the DiT's {self.max_window} "
                             "(max_position_embeddings / repeats); decode in chunks (Token2WavParams.chunk_size)")
        mel = self._sample(codes[None], self._noise(opts.seed, opts.offset, n), opts.voice, opts.params)
        # The chunk's mel frames with the vocoder's receptive field around them.
        first, last = self.repeats * (opts.start - opts.offset), self.repeats * (opts.end - opts.offset)
        lo, hi = max(0, first - self.vocoder_halo), min(mel.shape[2], last + self.vocoder_halo)
        wav = self.vocoder(mel[:, :, lo:hi]).reshape(-1)
        return wav[(first - lo) * self.hop:(last - lo) * self.hop].float().numpy()

    def _noise(self, seed: int, offset: int, num_codes: int) -> torch.Tensor:
        """Rows [offset, offset + num_codes) (in codes) of the whole utterance's initial noise."""
        generator = torch.Generator().manual_seed(seed)
        frames = self.repeats * (offset + num_codes)
        noise = torch.randn(1, frames, self.dit.mel_dim, generator=generator)
        return noise[:, self.repeats * offset:].to(self.device)

    @torch.inference_mode()  # the time cache holds inference tensors
    def _sample(self, codes: torch.Tensor, noise: torch.Tensor, voice: str, p: Token2WavParams) -> torch.Tensor:
        """`Qwen2_5OmniToken2WavDiTModel.sample` with the initial noise given: [1, mel_dim, frames]
        (its ODE function as `DiTVelocity`: the same numbers, the step-invariant parts once)."""
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

        speaker = self.speakers[voice]
        cond = speaker["cond"].to(self.device).float()[None].unsqueeze(1).repeat(1, noise.shape[1], 1)
        ref_mel = speaker["ref_mel"].to(self.device).float()
        guided = p.guidance_scale >= GUIDANCE_OFF
        velocity = DiTVelocity(self.dit, codes, cond, self.encoded_mels.encoded(voice, ref_mel, guided),
                               p.guidance_scale, self.time_terms)
        times = torch.linspace(0, 1, p.num_steps, device=self.device, dtype=cond.dtype)
        times += p.sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
        trajectory = RungeKutta4ODESolver(function=velocity, initial_value=noise).integrate(times)
        return trajectory[-1].permute(0, 2, 1)

    def _measure_vocoder_halo(self, probe_frames: int = 256) -> int:
        """Mel frames on each side that BigVGAN's output at a frame depends on: perturb the middle
        frame of a random mel and see how far the waveform changes."""
        generator = torch.Generator().manual_seed(0)
        mel = torch.randn(1, self.dit.mel_dim, probe_frames, generator=generator).to(self.device)
        bumped = mel.clone()
        middle = probe_frames // 2
        bumped[:, :, middle] += 0.5
        with torch.inference_mode():
            diff = (self.vocoder(mel).reshape(-1) - self.vocoder(bumped).reshape(-1)).abs()
        changed = torch.nonzero(diff > 0).flatten()
        if changed.numel() == 0:
            return 0
        reach = max(middle * self.hop - int(changed.min()), int(changed.max()) - (middle + 1) * self.hop + 1)
        halo = math.ceil(max(reach, 0) / self.hop)
        return halo if halo < middle else probe_frames * 16  # reaches the probe's edge: voice whole windows

    def close(self) -> None:
        self.model = self.dit = self.vocoder = self.encoded_mels = self.time_terms = None
