"""Wan's sequence-parallel plan (diffusers' own `_cp_plan`) and ring-attention processor
(accel/sequence_parallel.py, accel/ring_attention.py read them through the family's
`SequencePlan`): the video tokens are split; cross-attention to the prompt stays local. And its
tensor-parallel plan (accel/tensor_parallel.py): Wan's q/k RMSNorms run across all heads, so
they are sharded with the heads and all-reduce their sum of squares."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.diffusion.accel.declaration import SequencePlan, TensorPlan
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


def tensor_blocks(model: Any) -> list[Any]:
    """The DiT blocks and, on VACE, its control blocks: both are WanAttention x 2 + FeedForward."""
    return [*model.blocks, *getattr(model, "vace_blocks", [])]


def image_attention_blocks(model: Any) -> list[Any]:
    """I2V (Wan 2.1): the blocks whose cross-attention also reads the CLIP image tokens."""
    return [block for block in tensor_blocks(model) if block.attn2.add_k_proj is not None]


# WanAttnProcessor cuts the QKV by `heads` (local_heads=True): each rank's shard has heads / N.
TENSOR_PLAN = (
    TensorPlan(tensor_blocks,
               column=("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn2.to_q", "attn2.to_k", "attn2.to_v",
                       "ffn.net.0.proj"),
               row=("attn1.to_out.0", "attn2.to_out.0", "ffn.net.2"),
               attention=("attn1", "attn2"),
               norms=("attn1.norm_q", "attn1.norm_k", "attn2.norm_q", "attn2.norm_k")),
    # Only the image keys and values: the attention modules' heads are cut by the plan above.
    TensorPlan(image_attention_blocks, column=("attn2.add_k_proj", "attn2.add_v_proj"), row=(),
               attention=(), norms=("attn2.norm_added_k",)),
)
