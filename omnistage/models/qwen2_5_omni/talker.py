"""Qwen2.5-Omni talker as an AR stage: thinker states in, codec tokens out.

Its inputs are built from the thinker's output by `processors.talker_inputs`:

    {"prompt_embeds": [L + 2, H], "reply_embeds": [R, H],
     "mrope_positions": [3, L], "rope_delta": int}

and this model runs what the reference `Qwen2_5OmniTalkerForConditionalGeneration` does
inside `generate()`, one engine step at a time:

- prefill: token ids `[codec_mask] * L + [codec_pad, codec_bos]`; the input embeddings are
  `prompt_embeds`, plus the codec embeddings of pad and bos on the last two positions;
- decode step k: `codec_embed(previous code) + reply_embeds[min(k, R - 1)]` (the last
  reply row, tts_text_pad, is reused once the reply is spoken);
- both: `thinker_to_talker_proj`, the decoder, `codec_head`, with `codec_bos` suppressed.

M-RoPE positions continue the thinker's prompt positions over the two extra text tokens
(the voice's BOS and the first reply token), as `get_rope_index` on the reference's
`input_text_ids` gives. Stop ids are the codec pad and end tokens, read from the config
(the reference's `generate` signature hard-codes the real model's [8292, 8294]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omnistage.ar.kv_cache import kv_dims
from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs
from omnistage.models.qwen2_5_omni.thinker import attention_masks
from omnistage.models.qwen2_5_omni.weights import load_talker

_INPUT_KEYS = ("prompt_embeds", "reply_embeds", "mrope_positions", "rope_delta")


@dataclass
class TalkerState:
    prompt_embeds: torch.Tensor | None
    """[L + 2, H], dropped after prefill."""
    reply_embeds: torch.Tensor
    """[R, H]: thinker reply rows for decode steps 0..R-1; the last one repeats."""
    mrope_positions: torch.Tensor
    """[3, L + 2]."""
    rope_delta: int
    num_decoded: int = 0


class OmniTalker(ARModel):
    tokenizer = None  # emits codec ids, not text

    def __init__(self, model, device: torch.device) -> None:
        config = model.config
        if set(config.layer_types) != {"full_attention"}:
            raise ValueError(f"the talker supports full attention layers only, not {sorted(set(config.layer_types))}")
        self.model = model
        self.embed = model.model.embed_tokens
        self.device = device
        self.num_layers = config.num_hidden_layers
        self.kv_dims = kv_dims(config)
        self.max_position_embeddings = config.max_position_embeddings
        self.codec_mask, self.codec_pad = config.tts_codec_mask_token_id, config.tts_codec_pad_token_id
        self.codec_bos, self.codec_eos = config.tts_codec_start_token_id, config.tts_codec_end_token_id
        self.eos_token_ids = (self.codec_pad, self.codec_eos)

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> OmniTalker:
        return cls(load_talker(model_path, device, dtype), device)

    def build_prompt(self, inputs: Any) -> PromptInputs:
        if not isinstance(inputs, dict) or sorted(inputs) != sorted(_INPUT_KEYS):
            got = sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__
            raise ValueError(f"talker inputs must be a dict with keys {list(_INPUT_KEYS)} "
                             f"(built by the thinker -> talker processor), got {got}")
        prompt, reply = inputs["prompt_embeds"], inputs["reply_embeds"]
        thinker_pos = inputs["mrope_positions"]
        num_prompt = thinker_pos.shape[1]
        if prompt.shape[0] != num_prompt + 2 or reply.shape[0] < 1:
            raise ValueError(f"talker inputs: {prompt.shape[0]} prompt rows for a {num_prompt}-token thinker "
                             f"prompt (expected {num_prompt + 2}) and {reply.shape[0]} reply rows (expected >= 1)")
        # Two more text tokens after the prompt: positions continue from its largest one.
        tail = thinker_pos.max() + 1 + torch.arange(2, device=thinker_pos.device)
        positions = torch.cat([thinker_pos, tail.expand(3, 2)], dim=1).to(self.device)
        state = TalkerState(prompt.to(self.device, self.embed.weight.dtype),
                            reply.to(self.device, self.embed.weight.dtype), positions, int(inputs["rope_delta"]))
        return PromptInputs([self.codec_mask] * num_prompt + [self.codec_pad, self.codec_bos], state)

    def forward(self, batch: ModelInput, cache) -> ModelOutput:
        states = [s.model_state for s in batch.seqs]
        codec = self.embed(batch.input_ids)
        if batch.is_prefill:
            embeds, positions = self._prefill_inputs(batch, states, codec)
        else:
            rows = []
            for st in states:
                rows.append(st.reply_embeds[min(st.num_decoded, st.reply_embeds.shape[0] - 1)])
                st.num_decoded += 1
            embeds = codec + torch.stack(rows)[:, None]
            delta = torch.tensor([st.rope_delta for st in states], device=batch.positions.device)
            positions = (batch.positions + delta[:, None]).expand(3, -1, -1)
        out = self.model.model(inputs_embeds=self.model.thinker_to_talker_proj(embeds), position_ids=positions,
                               attention_mask=attention_masks(batch), cache=cache, use_cache=True)
        hidden = out.last_hidden_state
        if batch.is_prefill:
            last = hidden[torch.arange(hidden.shape[0], device=hidden.device), batch.last_indices]
        else:
            last = hidden[:, -1]
        logits = self.model.codec_head(last).float()
        logits[:, self.codec_bos] = -float("inf")  # the reference passes suppress_tokens=[codec_bos]
        return ModelOutput(logits=logits)

    def _prefill_inputs(self, batch: ModelInput, states: list[TalkerState], codec: torch.Tensor):
        b, t = batch.input_ids.shape
        embeds = codec.new_zeros(b, t, codec.shape[-1])
        positions = batch.positions.new_zeros(3, b, t)
        for i, st in enumerate(states):
            n = batch.query_lens[i]
            embeds[i, :n] = st.prompt_embeds
            # The reference adds codec embeddings to the last two positions only (pad, bos).
            embeds[i, n - 2:n] += codec[i, n - 2:n]
            positions[:, i, :n] = st.mrope_positions
            st.prompt_embeds = None
        return embeds, positions

    def close(self) -> None:
        self.model = self.embed = None

