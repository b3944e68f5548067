"""Qwen3-TTS's codec stage: the 12 Hz speech tokenizer's decoder, streamed.

The decoder is Qwen3-Omni's code2wav behind a split residual VQ (modeling.py), as causal,
so the stream logic is Qwen3-Omni's `Code2Wav` (each part decoded with `left_context`
frames before it, samples emitted from where the stream's audio ends); only the weights
come from `speech_tokenizer/`. The authors decode an utterance in 300-frame windows with
25 frames of left context (`chunked_decode`): one window for up to 300 frames, which is
`Code2WavParams(chunk_frames=0)` here (with a left context as long as a cloned voice's
reference codes, which are decoded first).
"""

from __future__ import annotations

import torch

from omnistage.models.qwen3_omni.code2wav import Code2Wav
from omnistage.models.qwen3_tts.modeling import load_codec_decoder


class Qwen3TTSCodec(Code2Wav):
    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype, max_streams: int) -> Qwen3TTSCodec:
        model, config = load_codec_decoder(model_path, device)
        codec = cls(model, device)
        codec.sample_rate = int(config.get("output_sample_rate", 24000))
        return codec

    def open_stream(self, options: dict | None = None):
        """A cloned voice's reference codes (`options["context_codes"]`) are decoded as left context
        before the first frames, and count as voiced: the authors decode reference + generated codes
        and cut the reference's share of the audio (its frames x 1920 samples)."""
        stream = super().open_stream(options)
        context = (options or {}).get("context_codes")
        if context is not None:
            codes = self.parse(context)
            stream.history = codes.T[:, -stream.left_context:]
            stream.num_frames = codes.shape[0]
            stream.num_samples = codes.shape[0] * self.upsample
        return stream
