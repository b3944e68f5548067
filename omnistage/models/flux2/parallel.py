"""FLUX.2's sequence-parallel plan (diffusers' own `_cp_plan`) and its attention processors for
Ulysses, ring and padded token counts (accel/sequence_parallel.py and accel/sequence_split.py
read them through the family's `SequencePlan`): the double-stream blocks' joint attention and
the single-stream blocks' fused attention + MLP, both over [text, image]. And its
tensor-parallel plan (accel/tensor_parallel.py): the fused projections are cut part by part."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.diffusion.accel.declaration import SequencePlan, TensorPlan
from omnistage.diffusion.accel.sequence_parallel import diffusers_plan, joint_lengths
from omnistage.diffusion.accel.sequence_split import SplitSequence
from omnistage.models.flux.parallel import JOINT, joint_qkv


def ring_processor(split: SplitSequence, current: Any) -> Any:
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.transformers.transformer_flux2 import (
        Flux2AttnProcessor,
        Flux2ParallelSelfAttnProcessor,
        _get_qkv_projections,
    )

    class SplitFlux2Processor(Flux2AttnProcessor):
        """Flux2AttnProcessor (diffusers 0.42) with the attention over the split."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor = None,
                     attention_mask: Any = None, image_rotary_emb: Any = None) -> Any:
            query, key, value = joint_qkv(attn, hidden_states, encoder_hidden_states, image_rotary_emb,
                                          _get_qkv_projections)
            out = split.attention(query, key, value, *JOINT).flatten(2, 3).to(query.dtype)
            if encoder_hidden_states is None:
                return attn.to_out[1](attn.to_out[0](out))
            seq_txt = encoder_hidden_states.shape[1]
            hidden_states = attn.to_out[1](attn.to_out[0](out[:, seq_txt:]))
            return hidden_states, attn.to_add_out(out[:, :seq_txt])

    class SplitFlux2SingleProcessor(Flux2ParallelSelfAttnProcessor):
        """Flux2ParallelSelfAttnProcessor (diffusers 0.42) with the attention over the split."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor, attention_mask: Any = None,
                     image_rotary_emb: Any = None) -> torch.Tensor:
            hidden_states = attn.to_qkv_mlp_proj(hidden_states)
            # The QKV and MLP halves by their global ratio (diffusers keeps it tensor-parallel agnostic).
            qkv_dim, mlp_dim = 3 * attn.inner_dim, attn.mlp_hidden_dim * attn.mlp_mult_factor
            local_qkv = hidden_states.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
            qkv, mlp = torch.split(hidden_states, [local_qkv, hidden_states.shape[-1] - local_qkv], dim=-1)
            query, key, value = (t.unflatten(-1, (-1, attn.head_dim)) for t in qkv.chunk(3, dim=-1))
            query, key = attn.norm_q(query), attn.norm_k(key)
            if image_rotary_emb is not None:
                query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
                key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
            out = split.attention(query, key, value, *JOINT).flatten(2, 3).to(query.dtype)
            return attn.to_out(torch.cat([out, attn.mlp_act_fn(mlp)], dim=-1))

    if isinstance(current, Flux2ParallelSelfAttnProcessor):
        return SplitFlux2SingleProcessor()
    return SplitFlux2Processor() if isinstance(current, Flux2AttnProcessor) else None


SEQUENCE_PLAN = SequencePlan(diffusers_plan, joint_lengths, ring_processor=ring_processor, pads=True)


def _double_column_parts(block: Any, name: str) -> list[int] | None:
    """The feed-forwards' linear_in holds the SwiGLU's gate and value halves."""
    if name.endswith("linear_in"):
        half = block.get_submodule(name).out_features // 2
        return [half, half]
    return None


def _single_column_parts(block: Any, name: str) -> list[int]:
    """to_qkv_mlp_proj: query, key, value, then the MLP's gate and value halves."""
    attn = block.attn
    return [attn.inner_dim] * 3 + [attn.mlp_hidden_dim] * attn.mlp_mult_factor


def _single_row_parts(block: Any, name: str) -> list[int]:
    """to_out reads [attention output, MLP hidden] concatenated: both are sharded."""
    return [block.attn.inner_dim, block.attn.mlp_hidden_dim]


# diffusers' FLUX.2 processors cut the QKV by head size (local_heads=False) and the single blocks'
# fused output by its parts' global ratio, which a part-by-part cut keeps. The modulation is
# shared by all blocks (outside them) and stays whole, as do the per-head q/k norms.
TENSOR_PLAN = (
    TensorPlan(lambda model: list(model.transformer_blocks),
               column=("attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                       "attn.add_v_proj", "ff.linear_in", "ff_context.linear_in"),
               row=("attn.to_out.0", "attn.to_add_out", "ff.linear_out", "ff_context.linear_out"),
               attention=("attn",), local_heads=False, column_parts=_double_column_parts),
    TensorPlan(lambda model: list(model.single_transformer_blocks),
               column=("attn.to_qkv_mlp_proj",), row=("attn.to_out",), attention=("attn",), local_heads=False,
               column_parts=_single_column_parts, row_parts=_single_row_parts),
)
