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

from omnistage.ar.sampling_params import SamplingParams


@dataclass
class SideRow:
    request_id: str
    params: SamplingParams
    all_token_ids: list[int] = field(default_factory=list)
    needs_min_tokens_mask: bool = False
    stop_ids: frozenset = frozenset()

    @classmethod
    def of(cls, seq, **overrides) -> SideRow:
        """The row for `seq`, its params with `overrides` (e.g. the reference's top_k / top_p)."""
        params = dataclasses.replace(seq.params, **overrides, repetition_penalty=1.0, min_tokens=0,
                                     stop_token_ids=[])
        return cls(seq.request_id, params)
