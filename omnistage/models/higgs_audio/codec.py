"""Higgs-Audio v2's codec stage: the audio tokenizer's decoder (codes -> 24 kHz), streamed.

The decoder (codec_model.py) is a DAC decoder: its convolutions are not causal, so an
output frame's samples depend on `context` frames on both sides (its receptive field,
computed from the convolution stack: 12 frames for the released tokenizer). A stream
therefore decodes each window with `context` frames already voiced on the left, and holds
back its last `context` frames (the lookahead) until more frames, or the end of the
stream (`flush`), arrive. Each voiced frame so sees all the frames a one-shot decode lets
it see, and chunked audio equals the one-shot decode (up to float rounding), at the cost of
`context` frames (0.48 s at 25 frames/s) of latency.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.generation.decoder import Decoder
from omnistage.models.higgs_audio.codec_model import HiggsCodecDecoder


def tokenizer_folder(model_path: str) -> Path:
    """The audio tokenizer `processor_config.json` names: a folder of the checkpoint, a local path,
    or a hub repo (from the local hub cache, or downloaded)."""
    config = json.loads((Path(model_path) / "processor_config.json").read_text())
    name = (config.get("audio_tokenizer") or {}).get("audio_tokenizer_name_or_path")
    if not name:
        raise ValueError(f"{model_path}/processor_config.json names no audio tokenizer (audio_tokenizer_name_or_path)")
    for folder in (Path(model_path) / name, Path(name)):
        if (folder / "config.json").is_file():
            return folder
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name, allow_patterns=["config.json", "*.safetensors"]))


def receptive_frames(decoder: torch.nn.Module) -> int:
    """How many frames on each side reach an output frame's samples, from the convolutions in
    forward order (each at its layer's rate: a transposed convolution multiplies it)."""
    reach, rate = 0.0, 1
    for module in decoder.modules():
        if isinstance(module, torch.nn.ConvTranspose1d):
            reach += math.ceil(module.kernel_size[0] / module.stride[0]) / rate
            rate *= module.stride[0]
        elif isinstance(module, torch.nn.Conv1d):
            reach += (module.kernel_size[0] - 1) * module.dilation[0] / 2 / rate
    return math.ceil(reach)


@dataclass
class _Stream:
    history: torch.Tensor | None = None
    """[N, <= context] the last voiced frames (left context), on the device."""
    pending: torch.Tensor | None = None
    """[N, <= context] frames received, not voiced yet (the lookahead)."""


class HiggsCodec(Decoder):
    supports_prepacked_linears = True  # the decoder only calls its linears
    chunk_frames = None  # all pending frames of a stream in one pass

    def __init__(self, model: HiggsCodecDecoder, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.sample_rate = model.sample_rate
        self.hop_length = model.hop_length
        self.num_quantizers = model.config.num_quantizers
        self.codebook_size = model.config.codebook_size
        self.context = receptive_frames(model.acoustic_decoder)

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype, max_streams: int) -> HiggsCodec:
        # fp32 whatever the stage dtype, as the other codecs: small, and the waveform is float.
        return cls(HiggsCodecDecoder.from_pretrained(tokenizer_folder(model_path), device), device)

    def parse(self, codes: Any) -> torch.Tensor:
        """[frames, num_quantizers] integer codes in [0, codebook_size)."""
        t = codes if torch.is_tensor(codes) else torch.as_tensor(codes)
        if t.numel() == 0:
            t = t.long().reshape(0, self.num_quantizers)
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.ndim != 2 or t.shape[1] != self.num_quantizers:
            raise ValueError(f"Higgs-Audio codes must be integer [frames, {self.num_quantizers}], "
                             f"got {t.dtype} {tuple(t.shape)}")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.codebook_size):
            raise ValueError(f"Higgs-Audio codes must be in [0, {self.codebook_size}), "
                             f"got [{int(t.min())}, {int(t.max())}]")
        return t.to(self.device)

    def open_stream(self, options: Any = None) -> _Stream:
        return _Stream()

    @torch.inference_mode()
    def decode(self, codes: list[torch.Tensor], states: list[_Stream]) -> list[np.ndarray]:
        # Rows differ in window length: one pass per row.
        return [self._voice(st, frames.T, keep=self.context) for frames, st in zip(codes, states)]

    @torch.inference_mode()
    def flush(self, state: _Stream) -> np.ndarray:
        return self._voice(state, None, keep=0)

    def _voice(self, st: _Stream, new: torch.Tensor | None, keep: int) -> np.ndarray:
        """Add `new` [N, n] frames and voice all unvoiced frames but the last `keep`."""
        parts = [t for t in (st.pending, new) if t is not None and t.shape[1]]
        todo = torch.cat(parts, dim=1) if parts else None
        num_voiced = 0 if todo is None else todo.shape[1] - keep
        if num_voiced <= 0:
            st.pending = todo
            return np.zeros(0, dtype=np.float32)
        left = 0 if st.history is None else st.history.shape[1]
        window = todo if st.history is None else torch.cat([st.history, todo], dim=1)
        wav = self.model(window[None])[0, 0]
        out = wav[left * self.hop_length:(left + num_voiced) * self.hop_length]
        voiced = window[:, :left + num_voiced]
        st.history = voiced[:, -self.context:]
        st.pending = todo[:, num_voiced:]
        return out.float().cpu().numpy()

    def close(self) -> None:
        self.model = None
