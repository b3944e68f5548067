"""Wan's sequence-parallel plan (diffusers' own `_cp_plan`) and ring-attention processor
(accel/sequence_parallel.py, accel/ring_attention.py read them through the family's
`SequencePlan`): the video tokens are split; cross-attention to the prompt stays local."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.diffusion.accel.declaration import SequencePlan
from omnistage.diffusion.accel.ring_attention import sequence_parallel_attention
from omnistage.diffusion.accel.sequence_parallel import diffusers_plan
from omnistage.diffusion.accel.sequence_split import SplitSequence


def split_lengths(model: Any, kwargs: dict) -> dict[str, int]:
    _, _, frames, height, width = kwargs["hidden_states"].shape
    pt, ph, pw = model.config.patch_size
    return {"video tokens": (frames // pt) * (height // ph) * (width // pw)}


def ring_processor(split: SplitSequence, current: Any) -> Any:
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor, _get_qkv_projections

    if not isinstance(current, WanAttnProcessor):
        return None

    class RingWanProcessor(WanAttnProcessor):
        """WanAttnProcessor (diffusers 0.42) with self-attention over the ring; cross-attention
        to the (whole, unsplit) prompt stays local."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: Any = None,
                     attention_mask: Any = None, rotary_emb: Any = None) -> torch.Tensor:
            if encoder_hidden_states is not None:
                return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
            query, key, value = _get_qkv_projections(attn, hidden_states, None)
            query, key = attn.norm_q(query), attn.norm_k(key)
            query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
            if rotary_emb is not None:
                query, key = _real_rope(query, *rotary_emb), _real_rope(key, *rotary_emb)
            out = sequence_parallel_attention(query, key, value, None, split.groups).flatten(2, 3).type_as(query)
            return attn.to_out[1](attn.to_out[0](out))

    return RingWanProcessor()


def _real_rope(x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = freqs_cos[..., 0::2], freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


SEQUENCE_PLAN = SequencePlan(diffusers_plan, split_lengths, ring_processor=ring_processor)
