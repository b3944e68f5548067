"""OmniVoice's network: a bidirectional Qwen3 over text and codebooks summed, one head per codebook.

The checkpoint is the authors' `OmniVoice` (`config.json` "model_type": "omnivoice", the
backbone's config in "llm_config"; `model.safetensors` with their names: `llm.*`,
`audio_embeddings` (one table of num_audio_codebook x audio_vocab_size rows),
`audio_heads` (all codebooks' logits from one linear)). Text positions embed the text
token; audio positions embed the sum of their codebooks' codes (row = code + codebook *
audio_vocab_size). Attention is whatever 4-D mask the caller gives: full within a sequence.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn


class OmniVoiceModel(nn.Module):
    def __init__(self, config: dict) -> None:
        from transformers import AutoConfig, AutoModel

        super().__init__()
        llm_config = dict(config["llm_config"])
        self.llm = AutoModel.from_config(AutoConfig.for_model(llm_config.pop("model_type"), **llm_config))
        self.num_codebooks = int(config["num_audio_codebook"])
        self.vocab_size = int(config["audio_vocab_size"])
        self.mask_id = int(config["audio_mask_id"])
        hidden = self.llm.config.hidden_size
        self.audio_embeddings = nn.Embedding(self.num_codebooks * self.vocab_size, hidden)
        self.audio_heads = nn.Linear(hidden, self.num_codebooks * self.vocab_size, bias=False)
        self.register_buffer("codebook_layer_offsets", torch.arange(self.num_codebooks) * self.vocab_size)

    @classmethod
    def from_pretrained(cls, path: str | Path, device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32) -> OmniVoiceModel:
        from safetensors.torch import load_file

        config = json.loads((Path(path) / "config.json").read_text())
        model = cls(config)
        state = load_file(str(Path(path) / "model.safetensors"))
        # The offsets are a buffer of the authors' class; a checkpoint need not carry it.
        state.setdefault("codebook_layer_offsets", torch.arange(model.num_codebooks) * model.vocab_size)
        model.load_state_dict(state, strict=True)
        return model.to(device=device, dtype=dtype).eval()

    def forward(self, input_ids: torch.Tensor, audio_mask: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids [N, codebooks, S] (text rows repeat the text token), audio_mask [N, S],
        attention_mask [N, 1, S, S] (bool) -> float32 logits [N, codebooks, S, audio_vocab_size]."""
        text = self.llm.get_input_embeddings()(input_ids[:, 0, :])
        shifted = input_ids * audio_mask.unsqueeze(1) + self.codebook_layer_offsets.view(1, -1, 1)
        audio = self.audio_embeddings(shifted).sum(dim=1)
        embeds = torch.where(audio_mask.unsqueeze(-1), audio, text)
        hidden = self.llm(inputs_embeds=embeds, attention_mask=attention_mask, return_dict=True)[0]
        n, s, _ = hidden.shape
        logits = self.audio_heads(hidden).view(n, s, self.num_codebooks, self.vocab_size).permute(0, 2, 1, 3)
        return logits.float()
