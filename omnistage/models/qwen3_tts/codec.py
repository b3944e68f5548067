"""Qwen3-TTS's codec stage: the 12 Hz speech tokenizer's decoder, streamed.

The decoder is Qwen3-Omni's code2wav behind a split residual VQ and a causal conv
(modeling.py), all causal, so the stream logic is Qwen3-Omni's `Code2Wav` (each chunk
decoded with the stream's carried state: transformer keys within the window, convolution
left context, transposed-convolution tails); only the weights come from
`speech_tokenizer/`, and the causal conv before the transformer carries its context too.
The authors decode an utterance in 300-frame windows with 25 frames of left context
(`chunked_decode`); for up to 300 frames that is one decode of all of them, which the
streamed decode equals.
"""

from __future__ import annotations

import torch

from omnistage.models.qwen3_omni.code2wav import Code2Wav, _Stream
from omnistage.models.qwen3_tts.modeling import load_codec_decoder


class Qwen3TTSCodec(Code2Wav):
    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype, max_streams: int) -> Qwen3TTSCodec:
        model, config = load_codec_decoder(model_path, device)
        codec = cls(model, device)
        codec.sample_rate = int(config.get("output_sample_rate", 24000))
        return codec

    def open_stream(self, options: dict | None = None) -> _Stream:
        """A cloned voice's reference codes (`options["context_codes"]`) are decoded with the first
        frames and their audio cut (its frames x 1920 samples), as the authors decode reference +
        generated codes and cut the reference's share."""
        stream = super().open_stream(options)
        context = (options or {}).get("context_codes")
        if context is not None:
            codes = self.parse(context)
            if codes.shape[0]:
                stream.prefix, stream.drop = codes, codes.shape[0] * self.upsample
        return stream

    def _embed(self, codes: torch.Tensor, lens: list[int], states: list[_Stream]) -> torch.Tensor:
        latent = self._conv(self.model.pre_conv, self.model.quantizer.decode(codes), lens, states)
        return latent.transpose(1, 2)

    def _run_transformer(self, hidden: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.model.pre_transformer(hidden, **kwargs)
