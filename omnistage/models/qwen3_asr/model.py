"""Qwen3-ASR as an AR stage: audio in, text out.

Wraps `Qwen3ASRForConditionalGeneration` without patching it. At admission (`build_prompt`)
the checkpoint's own `Qwen3ASRProcessor` lays the prompt out (chat template, one
`<|audio_pad|>` per audio-encoder output, the log-mel features), which wait in
`seq.model_state` until the prefill runs the audio encoder and projector and scatters their
output into the placeholder positions, as the reference's forward does (a prefix-cache hit
that covers the clip whole skips the encoder). Every forward then runs the Qwen3
decoder with the engine's masks and paged KV cache (`cache=`) and the tied LM head on the last
positions. Positions are plain (the released `-hf` config has no M-RoPE).

A prompt is chat messages (see `transcription.transcription_prompt`): an optional system turn
(context), a user turn with at most one audio part, and optionally an assistant turn that the
model continues (the forced "language <Name><asr_text>").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnistage.ar.hf_model import eos_token_ids
from omnistage.ar.media_spans import MediaSpan, fed_rows, media_digest
from omnistage.ar.kv_cache import kv_dims
from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs, sdpa_mask
from omnistage.core.errors import RequestError
from omnistage.models.chat_media import chat_media


class Qwen3ASR(ARModel):
    # Plain positions: a prefill may start at any cached position. A prompt with audio hits the
    # prefix cache by its clip's digest (`PromptInputs.media`) and is prefilled whole after the hit.
    supports_chunked_prefill = True
    supports_prepacked_linears = True  # transformers' encoder and decoder only call their linears

    def __init__(self, model, processor, eos: tuple[int, ...], device: torch.device) -> None:
        text_config = model.config.text_config
        layer_types = getattr(text_config, "layer_types", None) or ["full_attention"]
        if set(layer_types) != {"full_attention"}:
            raise ValueError(f"Qwen3-ASR supports full attention layers only, not {sorted(set(layer_types))}")
        self.model = model
        self.lm = model.model.language_model
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.eos_token_ids = eos
        self.device = device
        self.num_layers = text_config.num_hidden_layers
        self.kv_dims = kv_dims(text_config)
        self.max_position_embeddings = text_config.max_position_embeddings
        self.audio_token_id = model.config.audio_token_id
        self.sample_rate = processor.feature_extractor.sampling_rate

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> Qwen3ASR:
        from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

        model = Qwen3ASRForConditionalGeneration.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa")
        model = model.to(device).eval()
        return cls(model, AutoProcessor.from_pretrained(model_path), eos_token_ids(model_path, model.config), device)

    # --- admission -----------------------------------------------------------------------------

    def build_prompt(self, inputs: Any) -> PromptInputs:
        """Chat `messages` with at most one audio part; `prompt` / `prompt_token_ids` as any AR model
        (text only). A last assistant message is continued rather than closed."""
        if not isinstance(inputs, dict) or "messages" not in inputs:
            return super().build_prompt(inputs)
        messages = inputs["messages"]
        audios = chat_media(inputs).audios
        if len(audios) > 1:
            raise RequestError("messages", f"Qwen3-ASR hears one audio part per request, got {len(audios)}")
        continues = bool(messages) and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant"
        text = self.tokenizer.apply_chat_template(messages, chat_template=self.processor.chat_template, tokenize=False,
                                                  add_generation_prompt=not continues, continue_final_message=continues)
        if not audios:
            return PromptInputs(self.tokenizer(text)["input_ids"])
        from omnistage.media.audio import resample

        audio, rate = audios[0]
        wave = resample(audio, rate, self.sample_rate)
        # The processor's own call: its placeholder expansion and feature settings (its audio_kwargs).
        enc = self.processor(text=[text], audio=[wave], sampling_rate=self.sample_rate, return_tensors="pt")
        features = enc["input_features"].to(self.device, self.model.dtype), enc["input_features_mask"].to(self.device)
        ids = enc["input_ids"][0].tolist()
        start = ids.index(self.audio_token_id)
        span = MediaSpan(start, ids.count(self.audio_token_id), media_digest("audio", np.asarray(audio), rate))
        return PromptInputs(ids, features, media=(span,))

    # --- the forward ---------------------------------------------------------------------------

    def forward(self, batch: ModelInput, cache) -> ModelOutput:
        embeds = self.lm.embed_tokens(batch.input_ids)
        if batch.is_prefill:
            embeds = self._merge_audio(batch, embeds)
        out = self.lm(inputs_embeds=embeds, position_ids=batch.positions, attention_mask=sdpa_mask(batch),
                      cache=cache, use_cache=True)
        hidden = out.last_hidden_state
        if batch.is_prefill:
            last = hidden[torch.arange(hidden.shape[0], device=hidden.device), batch.last_indices]
        else:
            last = hidden[:, -1]
        return ModelOutput(logits=self.model.lm_head(last),
                           hidden_states=hidden if batch.output_hidden_states else None,
                           input_embeds=embeds if batch.output_input_embeds else None)

    def _merge_audio(self, batch: ModelInput, embeds: torch.Tensor) -> torch.Tensor:
        """Each row's clip encoded into the `<|audio_pad|>` positions it feeds (none: a hit covered the clip)."""
        rows = [(i, seq.model_state) for i, seq in enumerate(batch.seqs) if seq.model_state is not None]
        if not rows:
            return embeds
        embeds = embeds.clone()
        for i, audio in rows:
            mask = batch.input_ids[i] == self.audio_token_id
            if mask.any():
                audio = self.model.get_audio_features(*audio).pooler_output
                embeds[i, mask] = fed_rows(audio, mask).to(embeds.dtype)
            batch.seqs[i].model_state = None  # only the prefill reads it
        return embeds

    def close(self) -> None:
        self.model = self.lm = self.processor = None
