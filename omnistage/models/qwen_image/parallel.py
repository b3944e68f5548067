"""Qwen-Image's sequence-parallel plan (diffusers' own `_cp_plan`) and its joint-attention
processor for Ulysses, ring and padded token counts (accel/sequence_parallel.py and
accel/sequence_split.py read them through the family's `SequencePlan`), and its tensor-parallel plan
(accel/tensor_parallel.py)."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.diffusion.accel.declaration import SequencePlan, TensorPlan
from omnistage.diffusion.accel.sequence_parallel import diffusers_plan, joint_lengths
from omnistage.diffusion.accel.sequence_split import SplitSequence


def ring_processor(split: SplitSequence, current: Any) -> Any:
    from diffusers.models.transformers.transformer_qwenimage import (
        QwenDoubleStreamAttnProcessor2_0,
        apply_rotary_emb_qwen,
    )

    if not isinstance(current, QwenDoubleStreamAttnProcessor2_0):
        return None

    class SplitQwenProcessor(QwenDoubleStreamAttnProcessor2_0):
        """QwenDoubleStreamAttnProcessor2_0 (diffusers 0.42) with the joint attention over the split;
        the prompt mask is the split's (the whole sequence's), not this rank's piece of it."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor = None,
                     encoder_hidden_states_mask: Any = None, attention_mask: Any = None,
                     image_rotary_emb: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
            head_dim = attn.inner_dim // attn.heads
            img = [proj(hidden_states).unflatten(-1, (-1, head_dim)) for proj in (attn.to_q, attn.to_k, attn.to_v)]
            txt = [proj(encoder_hidden_states).unflatten(-1, (-1, head_dim))
                   for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)]
            for stream, norms in ((img, (attn.norm_q, attn.norm_k)), (txt, (attn.norm_added_q, attn.norm_added_k))):
                for i, norm in enumerate(norms):
                    if norm is not None:
                        stream[i] = norm(stream[i])
            if image_rotary_emb is not None:
                img_freqs, txt_freqs = image_rotary_emb
                for i in (0, 1):
                    img[i] = apply_rotary_emb_qwen(img[i], img_freqs, use_real=False)
                    txt[i] = apply_rotary_emb_qwen(txt[i], txt_freqs, use_real=False)
            query, key, value = (torch.cat([t, i], dim=1) for t, i in zip(txt, img))
            out = split.attention(query, key, value, "text tokens", "image tokens").flatten(2, 3).to(query.dtype)
            seq_txt = encoder_hidden_states.shape[1]
            img_out = attn.to_out[0](out[:, seq_txt:].contiguous())
            if len(attn.to_out) > 1:
                img_out = attn.to_out[1](img_out)
            return img_out, attn.to_add_out(out[:, :seq_txt].contiguous())

    return SplitQwenProcessor()


def token_masks(model: Any, kwargs: dict) -> dict[str, torch.Tensor]:
    mask = kwargs.get("encoder_hidden_states_mask")
    return {} if mask is None else {"text tokens": mask}


SEQUENCE_PLAN = SequencePlan(diffusers_plan, joint_lengths, ring_processor=ring_processor, pads=True,
                             token_masks=token_masks)

TENSOR_PLAN = (TensorPlan(
    lambda model: list(model.transformer_blocks),
    column=("attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
            "img_mlp.net.0.proj", "txt_mlp.net.0.proj"),
    row=("attn.to_out.0", "attn.to_add_out", "img_mlp.net.2", "txt_mlp.net.2"),
    # diffusers' processor takes the head size as inner_dim / heads and the head count from the shards.
    attention=("attn",), local_heads=False,
    # Each block's own modulation (a third of its weights): sharded, its output gathered.
    gathered=("img_mod.1", "txt_mod.1")),)
