"""OmniVoice's codec stage: Higgs-Audio v2's audio tokenizer decoder (from the checkpoint's
`audio_tokenizer/` folder), streamed one second of frames at a time.

The unmasking stage hands over all of a request's codes at once; the decoder voices them in
chunks of `chunk_frames`, with the context window that makes chunked audio equal the
one-shot decode (higgs_audio/codec.py). A stream's `options` carry the loudness gain of a
cloned voice (the authors scale a voice quieter than RMS 0.1 by ref_rms / 0.1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.models.higgs_audio.codec import HiggsCodec
from omnistage.models.higgs_audio.codec_model import HiggsCodecDecoder
from omnistage.models.talker_codec.window import ContextWindow


class OmniVoiceCodec(HiggsCodec):
    chunk_frames = 25  # one second of frames per stream per step: the first audio leaves early

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype, max_streams: int
             ) -> OmniVoiceCodec:
        return cls(HiggsCodecDecoder.from_pretrained(Path(model_path) / "audio_tokenizer", device), device)

    def open_stream(self, options: Any = None) -> tuple[ContextWindow, float]:
        gain = float((options or {}).get("gain", 1.0))
        return ContextWindow(), gain

    @torch.inference_mode()
    def decode(self, codes: list[torch.Tensor], states: list[tuple[ContextWindow, float]]) -> list[np.ndarray]:
        return [self._voice(window, frames.T, keep=self.context) * gain for frames, (window, gain) in zip(codes, states)]

    @torch.inference_mode()
    def flush(self, state: tuple[ContextWindow, float]) -> np.ndarray:
        window, gain = state
        return self._voice(window, None, keep=0) * gain
