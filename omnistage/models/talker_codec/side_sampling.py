"""Sampling a frame's other codebooks (a code predictor, a depth decoder) with the request's own
temperature, top-k/p and seed, through a second `ar.sampler.Sampler`.

The sampler reads a sequence's params and token history; a `SideRow` is what it reads for
those codes: the request's params without the rules that belong to the talker's own token
stream (repetition penalty, min_tokens, stop ids), with the reference's overrides where its
code predictor samples differently (Qwen3-Omni's top-k/p).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from omnistage.ar.sampler import Sampler
from omnistage.ar.sampling_params import SamplingParams


@dataclass
class SideRow:
    request_id: str
    params: SamplingParams
    all_token_ids: list[int] = field(default_factory=list)
    needs_min_tokens_mask: bool = False
    stop_ids: frozenset = frozenset()


class SideSampler:
    """The talker's second sampler: one `SideRow` per request, made on its first step and
    dropped (with the sampler's per-request state) when the talker releases the request."""

    def __init__(self, device: torch.device, **overrides) -> None:
        self.sampler = Sampler(device)
        self.overrides = overrides
        """Params the reference samples these codes with, whatever the request says (top_k, top_p)."""
        self.rows: dict[str, SideRow] = {}

    def row(self, seq) -> SideRow:
        row = self.rows.get(seq.request_id)
        if row is None:
            params = dataclasses.replace(seq.params, **self.overrides, repetition_penalty=1.0, min_tokens=0,
                                         stop_token_ids=[])
            row = self.rows[seq.request_id] = SideRow(seq.request_id, params)
        return row

    def __call__(self, logits: torch.Tensor, rows: list[SideRow]) -> torch.Tensor:
        """[len(rows), V] logits -> [len(rows)] codes, each row sampled with its request's params."""
        return self.sampler(logits, rows)

    def release(self, seq) -> None:
        self.rows.pop(seq.request_id, None)
        self.sampler.release(seq.request_id)
