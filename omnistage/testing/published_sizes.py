"""Transformers at their published sizes, built on the meta device (no memory, no weights), for
what depends only on the shapes: the bytes a tensor-parallel rank holds (tests, benchmarks).

diffusers' default config of a transformer class is its published checkpoint's for Wan (2.1
14B), FLUX.2 (dev), Z-Image, Qwen-Image and FLUX.1 (dev); SD3's defaults are a smaller model,
so its published config (stable-diffusion-3-medium's transformer/config.json) is given here.
"""

from __future__ import annotations

from typing import Any

PUBLISHED_CONFIGS: dict[str, dict[str, Any]] = {
    "SD3Transformer2DModel": dict(attention_head_dim=64, num_attention_heads=24, num_layers=24,
                                  caption_projection_dim=1536, joint_attention_dim=4096, pooled_projection_dim=2048,
                                  pos_embed_max_size=192, sample_size=128),
}


def published_transformer(model_class: str) -> Any:
    """The diffusers transformer class `model_class` at its published size, on the meta device."""
    import diffusers
    import torch

    with torch.device("meta"):
        return getattr(diffusers, model_class)(**PUBLISHED_CONFIGS.get(model_class, {}))


def rank_share(model: Any, plans: Any, size: int = 2) -> float:
    """The share of `model`'s parameter bytes rank 0 of `size` holds once `plans` shard its blocks
    (no forward runs: no process group is needed). `model` is sharded in place."""
    from omnistage.diffusion.accel.tensor_parallel import shard_block

    def nbytes() -> int:
        return sum(p.numel() * p.element_size() for p in model.parameters())

    whole = nbytes()
    for plan in plans:
        for block in plan.blocks(model):
            shard_block(block, plan, rank=0, size=size, group=None)
    return nbytes() / whole
