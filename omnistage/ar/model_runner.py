"""Turns a `SchedulerOutput` into tensors, runs the model once, samples one token per row.

The only torch-facing part of the AR engine besides the model and the cache. One
forward per step for the whole batch; the per-step work outside it is a handful of
small tensors built from Python lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omnistage.ar.kv_cache import SlotKVCache
from omnistage.ar.model import ARModel, ModelInput
from omnistage.ar.sampler import Sampler
from omnistage.ar.scheduler import SchedulerOutput
from omnistage.ar.sequence import Sequence


@dataclass
class RunnerOutput:
    token_ids: list[int]
    extras: list[dict[str, Any]] | None = None
    logprobs: list[Any] | None = None  # the sampler's per-row logprobs, when a row asked for them


class _StateRows:
    """A sequence's hidden states / input embeddings, one row per fed position, in a buffer
    sized for the whole request: outputs are views of it, nothing is re-concatenated."""

    def __init__(self, capacity: int, width: int, like: torch.Tensor) -> None:
        self.buf = like.new_empty(capacity, width)
        self.n = 0
        self.last = 0  # rows added by the last step

    def add(self, rows: torch.Tensor) -> None:
        self.last = rows.shape[0]
        self.buf[self.n:self.n + self.last] = rows
        self.n += self.last

    def view(self, start: int = 0) -> torch.Tensor:
        return self.buf[start:self.n]


class ModelRunner:
    def __init__(self, model: ARModel, max_num_seqs: int, max_model_len: int, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.max_model_len = max_model_len
        self.cache = SlotKVCache(model.num_layers, max_num_seqs, max_model_len, device)
        self.sampler = Sampler(device)
        self._arange = torch.arange(max_model_len + 1, device=device)
        self.hidden: dict[str, _StateRows] = {}
        self.embeds: dict[str, _StateRows] = {}

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput) -> RunnerOutput:
        for src, dst in batch.slot_moves:
            self.cache.move(src, dst)
        inp = self._prepare_prefill(batch) if batch.is_prefill else self._prepare_decode(batch)
        out = self.model.forward(inp, self.cache)
        token_ids = self.sampler(out.logits, batch.seqs)
        extras = self.model.on_sampled(inp, out, token_ids)
        if out.hidden_states is not None:
            self._keep(self.hidden, batch.seqs, inp, out.hidden_states, "return_hidden_states")
        if out.input_embeds is not None:
            self._keep(self.embeds, batch.seqs, inp, out.input_embeds, "return_input_embeds")
        return RunnerOutput(token_ids.tolist(), extras, self.sampler.last_logprobs)

    # --- inputs ------------------------------------------------------------------------------

    def _prepare_prefill(self, batch: SchedulerOutput) -> ModelInput:
        seqs = batch.seqs
        lens = [s.num_prompt_tokens for s in seqs]
        t = max(lens)
        ids = torch.tensor([s.prompt_token_ids + [0] * (t - n) for s, n in zip(seqs, lens)], device=self.device)
        lens_t = torch.tensor(lens, device=self.device)
        pos = self._arange[:t]
        # causal, and keys past the row's prompt are padding
        mask = (pos[None, :] <= pos[:, None])[None] & (pos[None, :] < lens_t[:, None])[:, None, :]
        self.cache.begin_prefill(batch.first_slot, len(seqs), t)
        want_hidden, want_embeds = _wants(seqs)
        return ModelInput(
            input_ids=ids, positions=pos.expand(len(seqs), t), attention_mask=mask[:, None],
            last_indices=lens_t - 1, query_lens=lens, kv_len=t, seqs=seqs, is_prefill=True,
            output_hidden_states=want_hidden, output_input_embeds=want_embeds,
        )

    def _prepare_decode(self, batch: SchedulerOutput) -> ModelInput:
        seqs = batch.seqs
        b = len(seqs)
        positions = [s.num_tokens - 1 for s in seqs]
        kv_len = max(positions) + 1
        ids_pos = torch.tensor([[s.last_token_id for s in seqs], positions], device=self.device)
        pos = ids_pos[1]
        mask = self._arange[:kv_len] <= pos[:, None]
        self.cache.begin_decode(pos, kv_len)
        want_hidden, want_embeds = _wants(seqs)
        return ModelInput(
            input_ids=ids_pos[0].view(b, 1), positions=pos.view(b, 1), attention_mask=mask.view(b, 1, 1, kv_len),
            last_indices=None, query_lens=[1] * b, kv_len=kv_len, seqs=seqs, is_prefill=False,
            output_hidden_states=want_hidden, output_input_embeds=want_embeds,
        )

    # --- per-request state outputs ----------------------------------------------------------

    def _keep(self, store: dict[str, _StateRows], seqs: list[Sequence], inp: ModelInput,
              states: torch.Tensor, flag: str) -> None:
        for i, seq in enumerate(seqs):
            if not getattr(seq, flag):
                continue
            rows = store.get(seq.request_id)
            if rows is None:
                capacity = seq.num_prompt_tokens + seq.max_tokens
                rows = store[seq.request_id] = _StateRows(capacity, states.shape[-1], states)
            rows.add(states[i, :inp.query_lens[i]])

    def close(self) -> None:
        self.cache = None
        self.hidden.clear()
        self.embeds.clear()

    def release(self, seq: Sequence) -> None:
        self.sampler.release(seq.request_id)
        self.hidden.pop(seq.request_id, None)
        self.embeds.pop(seq.request_id, None)
        self.model.release(seq)


def _wants(seqs: list[Sequence]) -> tuple[bool, bool]:
    hidden = embeds = False
    for s in seqs:
        hidden |= s.return_hidden_states
        embeds |= s.return_input_embeds
    return hidden, embeds
