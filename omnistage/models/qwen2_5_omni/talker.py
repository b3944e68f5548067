"""Qwen2.5-Omni talker as an AR stage: thinker states in, codec tokens out.

Its inputs are built from the thinker's output by `processors.talker_inputs` (whole):

    {"prompt_embeds": [L + 2, H], "reply_embeds": [R, H],
     "mrope_positions": [3, L], "rope_delta": int}

or streamed, as the thinker goes, by `processors.thinker_chunks`: the first chunk has
`prompt_embeds` [L + 1, H] (no reply row yet), empty `reply_embeds` and `"streamed": True`;
each later one (`extend_prompt`) is `{"reply_rows": [n, H], "final": bool}`, the thinker
rows in order (the final one ends with tts_text_eos and tts_text_pad). The first row
completes the prompt, the others are the reply rows, so the talker computes exactly what
the whole hand-off gives it; it only waits (`input_ready`) while the row its next step
reads has not arrived.

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

Prefix cache: the prompt's ids say nothing (one placeholder repeated), so its blocks are keyed
by digests of its rows and positions (`media_spans.row_spans`, the last group once the streamed
first reply row completes it): a repeated system prompt, whose rows the thinker's cache returns
bit for bit, hits here too, and the prefill feeds only the rows after the hit. Decode steps add
reply rows no digest covers, so only the prompt's blocks are published.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omnistage.ar.kv_cache import kv_dims
from omnistage.ar.media_spans import ROWS_PER_DIGEST, row_spans
from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs, sdpa_mask
from omnistage.models.qwen2_5_omni.weights import load_talker

_INPUT_KEYS = ("prompt_embeds", "reply_embeds", "mrope_positions", "rope_delta")
_STREAM_KEYS = ("reply_rows", "final")


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
    input_complete: bool = True
    """False while a streaming thinker has more rows to send (then no row repeats yet)."""
    prompt_rows: int = 0
    """Rows of `prompt_embeds` present (L + 2 once complete)."""


class OmniTalker(ARModel):
    tokenizer = None  # emits codec ids, not text
    supports_prepacked_linears = True  # its code reads the embedding's weight only

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
        streamed = isinstance(inputs, dict) and bool(inputs.get("streamed"))
        keys = sorted(inputs) if isinstance(inputs, dict) else None
        if keys is None or keys != sorted(_INPUT_KEYS + (("streamed",) if "streamed" in inputs else ())):
            got = keys if keys is not None else type(inputs).__name__
            raise ValueError(f"talker inputs must be a dict with keys {list(_INPUT_KEYS)} (and optionally "
                             f"'streamed'), built by the thinker -> talker processor; got {got}")
        prompt, reply = inputs["prompt_embeds"], inputs["reply_embeds"]
        thinker_pos = inputs["mrope_positions"]
        num_prompt = thinker_pos.shape[1]
        want_prompt, want_reply = (num_prompt + 1, 0) if streamed else (num_prompt + 2, 1)
        if prompt.shape[0] != want_prompt or reply.shape[0] < want_reply:
            raise ValueError(f"talker inputs: {prompt.shape[0]} prompt rows for a {num_prompt}-token thinker "
                             f"prompt (expected {want_prompt}) and {reply.shape[0]} reply rows "
                             f"(expected >= {want_reply})")
        # Two more text tokens after the prompt: positions continue from its largest one.
        tail = thinker_pos.max() + 1 + torch.arange(2, device=thinker_pos.device)
        positions = torch.cat([thinker_pos, tail.expand(3, 2)], dim=1).to(self.device)
        dtype = self.embed.weight.dtype
        prompt = prompt.to(self.device, dtype)
        if streamed:  # room for the first reply row, which completes the prompt when it comes
            prompt = torch.cat([prompt, prompt.new_zeros(1, prompt.shape[1])])
        state = TalkerState(prompt, reply.to(self.device, dtype), positions, int(inputs["rope_delta"]),
                            input_complete=not streamed, prompt_rows=want_prompt)
        ids = [self.codec_mask] * num_prompt + [self.codec_pad, self.codec_bos]
        known = want_prompt if not streamed else want_prompt // ROWS_PER_DIGEST * ROWS_PER_DIGEST
        return PromptInputs(ids, state, streamed=streamed, media=row_spans(prompt, positions, 0, known),
                            cache_outputs=False)

    def is_token_reproducible(self, prompt: PromptInputs) -> bool:
        return True  # every prompt row is digested (`media`); decode rows are not (`cache_outputs`)

    def extend_prompt(self, seq, inputs: Any) -> None:
        if not isinstance(inputs, dict) or sorted(inputs) != sorted(_STREAM_KEYS):
            raise ValueError(f"a streamed talker chunk must be a dict with keys {list(_STREAM_KEYS)}")
        st: TalkerState = seq.model_state
        if st.input_complete:
            raise ValueError(f"talker request {seq.request_id!r}: a chunk after the final one")
        rows = inputs["reply_rows"].to(self.device, self.embed.weight.dtype)
        if rows.shape[0] and st.prompt_rows < st.mrope_positions.shape[1]:
            st.prompt_embeds[-1] = rows[0]  # reply row 0 is the prompt's last position
            st.prompt_rows += 1
            rows = rows[1:]
            done = seq.media_spans[-1].end if seq.media_spans else 0  # the rest of the prompt's digests
            seq.media_spans += row_spans(st.prompt_embeds, st.mrope_positions, done)
        if rows.shape[0]:
            st.reply_embeds = torch.cat([st.reply_embeds, rows])
        st.input_complete = bool(inputs["final"])
        if st.input_complete and (st.prompt_rows < st.mrope_positions.shape[1] or st.reply_embeds.shape[0] == 0):
            raise ValueError(f"talker request {seq.request_id!r}: the final chunk leaves it without a reply row")

    def input_ready(self, seq) -> bool:
        st: TalkerState = seq.model_state
        if st.prompt_rows < st.mrope_positions.shape[1]:
            return False  # the prefill needs the first reply row
        # decode step k reads reply row k; past the rows, the last one repeats only once all are in
        return st.input_complete or seq.num_computed_tokens < seq.num_prompt_tokens or \
            st.num_decoded < st.reply_embeds.shape[0]

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
                               attention_mask={"full_attention": sdpa_mask(batch)}, cache=cache, use_cache=True)
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
            start, n = batch.context_lens[i], batch.query_lens[i]  # a prefix-cache hit skips rows ..start
            embeds[i, :n] = st.prompt_embeds[start:start + n]
            # The reference adds codec embeddings to the last two positions only (pad, bos); a prefill
            # is never chunked (its rows are read once), so it ends at the prompt's end.
            first = max(0, n - 2)
            embeds[i, first:n] += codec[i, first:n]
            positions[:, i, :n] = st.mrope_positions[:, start:start + n]
            st.prompt_embeds = None
        return embeds, positions

    def close(self) -> None:
        self.model = self.embed = None

