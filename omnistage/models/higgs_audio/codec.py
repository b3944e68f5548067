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
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.generation.decoder import Decoder
from omnistage.models.higgs_audio.codec_model import HiggsCodecDecoder
from omnistage.models.talker_codec.window import ContextWindow, receptive_frames


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
        self.context = receptive_frames(model.acoustic_decoder, causal=False)

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

    def open_stream(self, options: Any = None) -> ContextWindow:
        return ContextWindow()

    @torch.inference_mode()
    def decode(self, codes: list[torch.Tensor], states: list[ContextWindow]) -> list[np.ndarray]:
        # Rows differ in window length: one pass per row.
        return [self._voice(st, frames.T, keep=self.context) for frames, st in zip(codes, states)]

    @torch.inference_mode()
    def flush(self, state: ContextWindow) -> np.ndarray:
        return self._voice(state, None, keep=0)

    def _voice(self, st: ContextWindow, new: torch.Tensor | None, keep: int) -> np.ndarray:
        return st.voice(self.model, new, context=self.context, keep=keep, hop_length=self.hop_length)

    def close(self) -> None:
        self.model = None
