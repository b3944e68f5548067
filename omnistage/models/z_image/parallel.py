"""Z-Image's sequence-parallel plan and ring-attention processor (accel/sequence_parallel.py,
accel/ring_attention.py read them through the family's `SequencePlan`), and its tensor-parallel
plan (accel/tensor_parallel.py).

Z-Image's transformer has no diffusers `_cp_plan`, so the plan here splits its unified
[image, caption] sequence before the main layers and gathers it after them (the refiner
layers run whole on every rank). It pads its image and caption token runs to multiples of
32 (SEQ_MULTI_OF), so its sequence always divides by a degree that divides 32.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.diffusion.accel.declaration import SequencePlan, TensorPlan
from omnistage.diffusion.accel.ring_attention import sequence_parallel_attention
from omnistage.diffusion.accel.sequence_split import SplitSequence

SEQ_MULTIPLE = 32


def sequence_plan(model: Any) -> dict:
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    return {
        "layers.0": {"x": ContextParallelInput(split_dim=1, expected_dims=3)},
        # Every main layer is handed the whole sequence's RoPE frequencies: each takes its piece.
        "layers.*": {"freqs_cis": ContextParallelInput(split_dim=1, expected_dims=3)},
        f"layers.{len(model.layers) - 1}": ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


def ring_processor(split: SplitSequence, current: Any) -> Any:
    from diffusers.models.transformers.transformer_z_image import ZSingleStreamAttnProcessor

    if not isinstance(current, ZSingleStreamAttnProcessor):
        return None

    class RingZImageProcessor(ZSingleStreamAttnProcessor):
        """ZSingleStreamAttnProcessor (diffusers 0.42) with the attention over the ring."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: Any = None,
                     attention_mask: torch.Tensor | None = None, freqs_cis: torch.Tensor | None = None) -> torch.Tensor:
            query, key, value = (proj(hidden_states).unflatten(-1, (attn.heads, -1))
                                 for proj in (attn.to_q, attn.to_k, attn.to_v))
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            if freqs_cis is not None:
                query, key = _complex_rope(query, freqs_cis), _complex_rope(key, freqs_cis)
            out = sequence_parallel_attention(query, key, value, attention_mask, split.groups).flatten(2, 3)
            output = attn.to_out[0](out.to(query.dtype))
            return attn.to_out[1](output) if len(attn.to_out) > 1 else output

    return RingZImageProcessor()


def _complex_rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2)) * freqs_cis.unsqueeze(2)
    return torch.view_as_real(rotated).flatten(3).type_as(x)


SEQUENCE_PLAN = SequencePlan(sequence_plan, lambda model, kwargs: {},
                             attention=lambda model: list(model.layers.modules()),
                             sequence_multiple=SEQ_MULTIPLE, ring_processor=ring_processor)


def tensor_blocks(model: Any) -> list[Any]:
    """Every ZImageTransformerBlock: the refiners' and the main layers'."""
    refiners = [model.noise_refiner, model.context_refiner, getattr(model, "siglip_refiner", None) or []]
    return [block for blocks in (*refiners, model.layers) for block in blocks]


TENSOR_PLAN = (TensorPlan(
    tensor_blocks,
    column=("attention.to_q", "attention.to_k", "attention.to_v", "feed_forward.w1", "feed_forward.w3"),
    row=("attention.to_out.0", "feed_forward.w2"),
    attention=("attention",)),)
