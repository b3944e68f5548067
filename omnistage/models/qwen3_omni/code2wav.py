"""Qwen3-Omni code2wav as a generation-engine decoder: codec frames [frames, G] -> 24 kHz audio.

`Qwen3OmniMoeCode2Wav` embeds a frame's G codes (mean of the codebook embeddings), runs a
sliding-window causal transformer, then causal (transposed) convolutions up to 1920 samples
per frame. Everything in it is causal and a transposed convolution's trimmed output
sample depends only on frames already given, so a window of frames [w0, w1) yields final
samples from `w0 * upsample` on, a little short of `w1 * upsample` (the last frame's
overlap is cut).

A stream decodes each part with the last `left_context` frames before it (as the
reference's `chunked_decode`), and emits the window's samples from where the stream's
audio so far ends: the next part's window re-makes the short tail. So chunks join without a
gap, the stream's audio has the one-shot length, and with a left context as long as the
receptive field it equals the one-shot decode; the reference's 25 frames approximate it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omnistage.generation.decoder import Decoder
from omnistage.models.qwen3_omni.params import DEFAULT_LEFT_CONTEXT
from omnistage.models.qwen3_omni.weights import load_code2wav

SAMPLE_RATE = 24000  # a fact of the released model that its config does not store


@dataclass
class _Stream:
    left_context: int
    history: torch.Tensor | None = None
    """[G, <= left_context] the last frames decoded, on the device."""
    num_frames: int = 0
    num_samples: int = 0
    """Samples emitted so far."""


class Code2Wav(Decoder):
    supports_prepacked_linears = True  # the decoder's code only calls its linears
    sample_rate = SAMPLE_RATE
    chunk_frames = None  # all pending frames of a stream in one pass

    def __init__(self, model, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.num_quantizers = model.config.num_quantizers
        self.codebook_size = model.config.codebook_size
        self.upsample = int(model.total_upsample)

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype, max_streams: int) -> Code2Wav:
        return cls(load_code2wav(model_path, device), device)

    def parse(self, codes: Any) -> torch.Tensor:
        """[frames, num_quantizers] integer codes in [0, codebook_size)."""
        t = codes if torch.is_tensor(codes) else torch.as_tensor(codes)
        if t.numel() == 0:
            t = t.long().reshape(0, self.num_quantizers)
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.ndim != 2 or t.shape[1] != self.num_quantizers:
            raise ValueError(f"code2wav codes must be integer [frames, {self.num_quantizers}], "
                             f"got {t.dtype} {tuple(t.shape)}")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.codebook_size):
            raise ValueError(f"code2wav codes must be in [0, {self.codebook_size}), got [{int(t.min())}, {int(t.max())}]")
        return t.to(self.device)

    def open_stream(self, options: dict | None = None) -> _Stream:
        left = (options or {}).get("left_context", DEFAULT_LEFT_CONTEXT)
        if not isinstance(left, int) or left < 1:
            raise ValueError(f"code2wav left_context must be an integer >= 1, got {left!r}")
        return _Stream(left)

    @torch.inference_mode()
    def decode(self, codes: list[torch.Tensor], states: list[_Stream]) -> list[np.ndarray]:
        # Rows differ in window length and the transformer has no padding mask: one pass per row.
        return [self._continue(c, st) for c, st in zip(codes, states)]

    def _continue(self, frames: torch.Tensor, st: _Stream) -> np.ndarray:
        if frames.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        new = frames.T  # [G, n]
        window = new if st.history is None else torch.cat([st.history, new], dim=1)
        first = st.num_frames + new.shape[1] - window.shape[1]  # the window's first frame in the stream
        wav = self.model(window[None]).reshape(-1)
        out = wav[st.num_samples - first * self.upsample:]
        st.num_frames += new.shape[1]
        st.num_samples += out.shape[0]
        st.history = window[:, -st.left_context:] if st.left_context else None
        return out.float().cpu().numpy()

    def close(self) -> None:
        self.model = None
