"""SD3's sequence-parallel plan and its joint-attention processor for Ulysses, ring and padded
token counts (accel/sequence_parallel.py and accel/sequence_split.py read them through the
family's `SequencePlan`).

diffusers' SD3 transformer has no `_cp_plan`, and its JointAttnProcessor2_0 calls torch's SDPA
directly, so both are here: the plan splits the patch embedding's image tokens and the context
embedder's text tokens as they are made (so a skipped layer changes nothing) and gathers the
image tokens before the transformer unpatchifies them.

Its tensor-parallel plan (accel/tensor_parallel.py) is three, by kind of block: every joint
block's attention and image MLP; the text MLP and text output projection of all but the last
block (`context_pre_only`: its text stream ends there, with neither); SD3.5's second,
image-only attention (`dual_attention_layers`). Each block's adaLN modulation Linears are
split too and their output all-gathered."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.diffusion.accel.declaration import SequencePlan, TensorPlan
from omnistage.diffusion.accel.sequence_split import SplitSequence


def sequence_plan(model: Any) -> dict:
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    tokens = {0: ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)}
    return {"pos_embed": tokens, "context_embedder": tokens,
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def split_lengths(model: Any, kwargs: dict) -> dict[str, int]:
    height, width = kwargs["hidden_states"].shape[-2:]
    patch = model.config.patch_size
    return {"image tokens": (height // patch) * (width // patch),
            "text tokens": kwargs["encoder_hidden_states"].shape[1]}


def ring_processor(split: SplitSequence, current: Any) -> Any:
    from diffusers.models.attention_processor import JointAttnProcessor2_0

    if not isinstance(current, JointAttnProcessor2_0):
        return None

    class SplitJointProcessor(JointAttnProcessor2_0):
        """JointAttnProcessor2_0 (diffusers 0.42) with the attention over the split: [image, text]
        in the joint blocks, the image alone in SD3.5's second attention."""

        def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor = None,
                     attention_mask: Any = None, *args: Any, **kwargs: Any) -> Any:
            head_dim = attn.to_k.out_features // attn.heads
            query, key, value = (proj(hidden_states).unflatten(-1, (attn.heads, head_dim))
                                 for proj in (attn.to_q, attn.to_k, attn.to_v))
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            names = ("image tokens",)
            if encoder_hidden_states is not None:
                ctx_q, ctx_k, ctx_v = (proj(encoder_hidden_states).unflatten(-1, (attn.heads, head_dim))
                                       for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
                if attn.norm_added_q is not None:
                    ctx_q = attn.norm_added_q(ctx_q)
                if attn.norm_added_k is not None:
                    ctx_k = attn.norm_added_k(ctx_k)
                query, key, value = (torch.cat(pair, dim=1) for pair in ((query, ctx_q), (key, ctx_k), (value, ctx_v)))
                names = ("image tokens", "text tokens")
            out = split.attention(query, key, value, *names).flatten(2, 3).to(query.dtype)
            seq_img = hidden_states.shape[1]
            hidden_states = attn.to_out[1](attn.to_out[0](out[:, :seq_img]))
            if encoder_hidden_states is None:
                return hidden_states
            context = out[:, seq_img:]
            return hidden_states, context if attn.context_pre_only else attn.to_add_out(context)

    return SplitJointProcessor()


SEQUENCE_PLAN = SequencePlan(sequence_plan, split_lengths, ring_processor=ring_processor, pads=True)


# JointAttnProcessor2_0 takes the head size as the shard's width / `heads`: heads are local.
TENSOR_PLAN = (
    TensorPlan(lambda model: list(model.transformer_blocks),
               column=("attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
                       "ff.net.0.proj"),
               row=("attn.to_out.0", "ff.net.2"), attention=("attn",),
               # Each block's own modulation is a third of its weights: sharded, gathered.
               gathered=("norm1.linear", "norm1_context.linear")),
    TensorPlan(lambda model: [block for block in model.transformer_blocks if not block.context_pre_only],
               column=("ff_context.net.0.proj",), row=("attn.to_add_out", "ff_context.net.2"), attention=()),
    TensorPlan(lambda model: [block for block in model.transformer_blocks if block.use_dual_attention],
               column=("attn2.to_q", "attn2.to_k", "attn2.to_v"), row=("attn2.to_out.0",), attention=("attn2",)),
)
