"""transformers' own Higgs-Audio v2 pipeline on a zoo checkpoint: the processor (chat template,
delay-pattern revert, codec decode) and `generate`, as the model card runs them.

transformers' audio tokenizer module imports torchaudio at the top (for `encode`'s resampler),
and torchaudio is no dependency of ours: a stand-in module lets it import. Decoding never
calls it; anything that does fails loudly.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

import torch


def _audio_tokenizer_class():
    import transformers  # noqa: F401  (its import-time backend checks run before the stand-in exists)

    if "torchaudio" not in sys.modules:
        stand_in = types.ModuleType("torchaudio")
        stand_in.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)

        def _unavailable(name):
            raise RuntimeError(f"torchaudio.{name}: not installed (the reference only decodes)")

        stand_in.__getattr__ = _unavailable
        sys.modules["torchaudio"] = stand_in
    from transformers.models.higgs_audio_v2_tokenizer.modeling_higgs_audio_v2_tokenizer import (
        HiggsAudioV2TokenizerModel)

    return HiggsAudioV2TokenizerModel


class HiggsReference:
    def __init__(self, path: str) -> None:
        import json
        from pathlib import Path

        from transformers import AutoTokenizer, HiggsAudioV2ForConditionalGeneration, HiggsAudioV2Processor

        config = json.loads((Path(path) / "processor_config.json").read_text())
        codec = _audio_tokenizer_class().from_pretrained(Path(path) / config["audio_tokenizer"]
                                                         ["audio_tokenizer_name_or_path"]).eval()
        # The processor's own methods over its state: its __init__ checks the audio tokenizer
        # against transformers' top-level class, which without torchaudio is a placeholder.
        self.processor = HiggsAudioV2Processor.__new__(HiggsAudioV2Processor)
        self.processor.audio_tokenizer = codec
        self.processor.audio_stream_bos_id = config["audio_stream_bos_id"]
        self.processor.audio_stream_eos_id = config["audio_stream_eos_id"]
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.chat_template = (Path(path) / "chat_template.jinja").read_text()
        self.model = HiggsAudioV2ForConditionalGeneration.from_pretrained(path).eval()

    @torch.inference_mode()
    def generate(self, conversations: list[list[dict]], max_new_tokens: int) -> tuple[torch.Tensor, list]:
        """Greedy `generate` of a batch of chats -> (delayed codes [B, rows, N], waveforms)."""
        texts = [self.tokenizer.apply_chat_template(c, chat_template=self.chat_template, tokenize=False,
                                                    add_generation_prompt=True) for c in conversations]
        # What the processor's __call__ does with text: left padding (HiggsAudioV2Processor.text_kwargs).
        inputs = self.tokenizer(texts, padding=True, padding_side="left", add_special_tokens=False,
                                return_tensors="pt")
        codes = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        return codes, [w.numpy() for w in self.processor.batch_decode(codes)]

    def frames(self, codes: torch.Tensor) -> torch.Tensor:
        """One chat's delayed rows -> the undelayed frames the codec decodes, as `batch_decode`."""
        rows = codes[1:]  # after the all-BOS row
        eos = (rows == self.processor.audio_stream_eos_id).all(-1).nonzero()
        rows = rows[:int(eos[0, 0])] if len(eos) else rows
        return self.processor.revert_delay_pattern(rows).clip(0, self.processor.audio_stream_bos_id - 1)
