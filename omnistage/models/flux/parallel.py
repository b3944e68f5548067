"""FLUX's sequence-parallel plan (diffusers' own `_cp_plan`) and its attention processor for
Ulysses, ring and padded token counts (accel/sequence_parallel.py and accel/sequence_split.py
read them through the family's `SequencePlan`). FLUX.2 (models/flux2/parallel.py) reuses
`joint_qkv`: its attention computes query, key and value the same way. Its tensor-parallel plan
(accel/tensor_parallel.py) covers both kinds of block."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from omnistage.diffusion.accel.declaration import SequencePlan, TensorPlan
from omnistage.diffusion.accel.sequence_parallel import diffusers_plan, joint_lengths
from omnistage.diffusion.accel.sequence_split import SplitSequence

JOINT = ("text tokens", "image tokens")
"""Both block kinds attend over [text, image]: the double blocks concatenate the two streams,
the single blocks get them concatenated."""


def joint_qkv(attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None,
              image_rotary_emb: Any, get_qkv: Callable) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FluxAttnProcessor's (and Flux2AttnProcessor's) query, key and value (diffusers 0.42), [B, S, H, D]."""
    from diffusers.models.embeddings import apply_rotary_emb

    query, key, value, encoder_query, encoder_key, encoder_value = get_qkv(attn, hidden_states, encoder_hidden_states)
    query, key, value = (t.unflatten(-1, (-1, attn.head_dim)) for t in (query, key, value))
    query, key = attn.norm_q(query), attn.norm_k(key)
    if attn.added_kv_proj_dim is not None:
        encoder_query, encoder_key, encoder_value = (t.unflatten(-1, (-1, attn.head_dim))
                                                     for t in (encoder_query, encoder_key, encoder_value))
        encoder_query, encoder_key = attn.norm_added_q(encoder_query), attn.norm_added_k(encoder_key)
        query = torch.cat([encoder_query, query], dim=1)
        key = torch.cat([encoder_key, key], dim=1)
        value = torch.cat([encoder_value, value], dim=1)
    if image_rotary_emb is not None:
        query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
        key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
    return query, key, value


def ring_processor(split: SplitSequence, current: Any) -> Any:
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor, _get_qkv_projections

    if not isinstance(current, FluxAttnProcessor):
        return None

    class SplitFluxProcessor(FluxAttnProcessor):
        """FluxAttnProcessor (diffusers 0.42) with the attention over the split."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor = None,
                     attention_mask: Any = None, image_rotary_emb: Any = None) -> Any:
            query, key, value = joint_qkv(attn, hidden_states, encoder_hidden_states, image_rotary_emb,
                                          _get_qkv_projections)
            out = split.attention(query, key, value, *JOINT).flatten(2, 3).to(query.dtype)
            if encoder_hidden_states is None:
                return out
            seq_txt = encoder_hidden_states.shape[1]
            hidden_states = attn.to_out[1](attn.to_out[0](out[:, seq_txt:].contiguous()))
            return hidden_states, attn.to_add_out(out[:, :seq_txt].contiguous())

    return SplitFluxProcessor()


SEQUENCE_PLAN = SequencePlan(diffusers_plan, joint_lengths, ring_processor=ring_processor, pads=True)


def _single_row_parts(block: Any, name: str) -> list[int]:
    """proj_out reads [attention output, MLP hidden] concatenated: both are sharded."""
    return [block.proj_out.in_features - block.mlp_hidden_dim, block.mlp_hidden_dim]


# diffusers' FLUX processor cuts the QKV by head size, so `heads` stays as it is (local_heads=False).
# Each block's own modulation (norm*.linear, a third of its weights) is sharded, its output gathered.
TENSOR_PLAN = (
    TensorPlan(lambda model: list(model.transformer_blocks),
               column=("attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                       "attn.add_v_proj", "ff.net.0.proj", "ff_context.net.0.proj"),
               row=("attn.to_out.0", "attn.to_add_out", "ff.net.2", "ff_context.net.2"),
               attention=("attn",), local_heads=False, gathered=("norm1.linear", "norm1_context.linear")),
    TensorPlan(lambda model: list(model.single_transformer_blocks),
               column=("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"), row=("proj_out",),
               attention=("attn",), local_heads=False, row_parts=_single_row_parts, gathered=("norm.linear",)),
)
