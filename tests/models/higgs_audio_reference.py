"""transformers' own Higgs-Audio v2 pipeline on a zoo checkpoint: the processor (chat template,
delay-pattern revert, codec decode) and `generate`, as the model card runs them.

transformers' audio tokenizer module imports torchaudio at the top (for `encode`'s resampler),
and torchaudio is no dependency of ours: a stand-in module lets it import, whose
`functional.resample` is omnistage's resampler (the one the server's encoder uses).
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

import numpy as np
import torch


def _resample(waveform: torch.Tensor, orig_freq: int, new_freq: int, **_) -> torch.Tensor:
    """torchaudio.functional.resample's place: omnistage's resampler, which the server's encoder
    uses too (the rest of encoding is compared, not the resampling filter)."""
    from omnistage.media.audio import resample

    rows = [resample(r, orig_freq, new_freq) for r in waveform.reshape(-1, waveform.shape[-1]).numpy()]
    return torch.from_numpy(np.stack(rows)).reshape(*waveform.shape[:-1], -1)


def _audio_tokenizer_class():
    import transformers  # noqa: F401  (its import-time backend checks run before the stand-in exists)

    stand_in = None
    if "torchaudio" not in sys.modules:
        stand_in = types.ModuleType("torchaudio")
        stand_in.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
        stand_in.functional = types.ModuleType("torchaudio.functional")
        stand_in.functional.resample = _resample
        sys.modules["torchaudio"] = stand_in
    try:
        from transformers.models.higgs_audio_v2_tokenizer.modeling_higgs_audio_v2_tokenizer import (
            HiggsAudioV2TokenizerModel)
    finally:
        # Only that module keeps it (bound at its import): no later import in this process finds it.
        if stand_in is not None and sys.modules.get("torchaudio") is stand_in:
            del sys.modules["torchaudio"]

    return HiggsAudioV2TokenizerModel


class HiggsReference:
    def __init__(self, path: str) -> None:
        import json
        from pathlib import Path

        from transformers import (AutoTokenizer, DacFeatureExtractor, HiggsAudioV2ForConditionalGeneration,
                                  HiggsAudioV2Processor)

        config = json.loads((Path(path) / "processor_config.json").read_text())
        codec = _audio_tokenizer_class().from_pretrained(Path(path) / config["audio_tokenizer"]
                                                         ["audio_tokenizer_name_or_path"]).eval()
        # The processor's own methods over its state: its __init__ checks the audio tokenizer
        # against transformers' top-level class, which without torchaudio is a placeholder.
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.processor = processor = HiggsAudioV2Processor.__new__(HiggsAudioV2Processor)
        processor.audio_tokenizer, processor.tokenizer = codec, self.tokenizer
        processor.feature_extractor = DacFeatureExtractor(**{k: v for k, v in config["feature_extractor"].items()
                                                             if k != "feature_extractor_type"})
        processor.audio_token, processor.audio_delay_token = "<|AUDIO_OUT|>", "<|reserved_special_token_6|>"
        processor.audio_stream_bos_id = config["audio_stream_bos_id"]
        processor.audio_stream_eos_id = config["audio_stream_eos_id"]
        self.chat_template = (Path(path) / "chat_template.jinja").read_text()
        self.model = HiggsAudioV2ForConditionalGeneration.from_pretrained(path).eval()

    @torch.inference_mode()
    def generate(self, conversations: list[list[dict]], max_new_tokens: int, clips: list | None = None
                 ) -> tuple[torch.Tensor, list]:
        """Greedy `generate` of a batch of chats (with `clips`, 24 kHz, for their audio parts in order)
        -> (delayed codes [B, rows, N], waveforms)."""
        texts = [self.tokenizer.apply_chat_template(c, chat_template=self.chat_template, tokenize=False,
                                                    add_generation_prompt=True) for c in conversations]
        inputs = self.processor(text=texts, audio=clips, return_tensors="pt")
        codes = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        return codes, [w.numpy() for w in self.processor.batch_decode(codes)]

    def frames(self, codes: torch.Tensor) -> torch.Tensor:
        """One chat's delayed rows -> the undelayed frames the codec decodes, as `batch_decode`."""
        start = int((codes == self.processor.audio_stream_bos_id).all(-1).nonzero()[-1, 0])
        rows = codes[start + 1:]  # after the last all-BOS row (a cloned voice's clip has one too)
        eos = (rows == self.processor.audio_stream_eos_id).all(-1).nonzero()
        rows = rows[:int(eos[0, 0])] if len(eos) else rows
        return self.processor.revert_delay_pattern(rows).clip(0, self.processor.audio_stream_bos_id - 1)
