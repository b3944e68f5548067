"""Ovis-Image zoo builder: `OvisImagePipeline` (a Qwen3 text encoder read through its chat
template, a FLUX-style MMDiT without pooled text or guidance embedding, FLUX.1's 16-channel VAE).

The pipeline drops the first 28 tokens of every encoded prompt (`user_prompt_begin_id`, the
chat header and system prompt in the real Qwen3 tokenizer); the tiny tokenizer splits that
header differently, so a few of the prompt's own tokens are dropped too, on both sides alike.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import (
    IMAGE_SIDE,
    autoencoder_kl,
    flow_match_scheduler,
    qwen3_text_encoder,
    save_pipeline,
    seed_everything,
)
from omnistage.testing.diffusion_models import NEGATIVE_PROMPT, PROMPT
from omnistage.testing.tokenizers import build_qwen2_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")

_OVIS = {
    "tiny": dict(text_hidden=16, heads=2, head_dim=16, layers=1, single_layers=1, axes=(4, 6, 6)),
    "small": dict(text_hidden=32, heads=4, head_dim=32, layers=2, single_layers=4, axes=(8, 12, 12)),
}

# FLUX.1-dev's scheduler settings (Ovis-Image's pipeline shifts its sigmas the same way).
_OVIS_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                       max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)


def build_ovis_image(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import OvisImagePipeline, OvisImageTransformer2DModel

    dims = _OVIS[size]
    seed_everything(seed)
    tokenizer = build_qwen2_tokenizer()
    transformer = OvisImageTransformer2DModel(
        patch_size=1,
        in_channels=64,  # 16 latent channels packed 2x2
        out_channels=64,
        num_layers=dims["layers"],
        num_single_layers=dims["single_layers"],
        attention_head_dim=dims["head_dim"],
        num_attention_heads=dims["heads"],
        joint_attention_dim=dims["text_hidden"],
        axes_dims_rope=dims["axes"],
    )
    pipe = OvisImagePipeline(
        scheduler=flow_match_scheduler(**_OVIS_SCHEDULER),
        vae=autoencoder_kl(size, scaling_factor=0.3611, shift_factor=0.1159),
        text_encoder=qwen3_text_encoder(tokenizer, hidden_size=dims["text_hidden"]),
        tokenizer=tokenizer,
        transformer=transformer,
    )
    save_pipeline(pipe, out_dir)


_CALL_KWARGS = dict(prompt=PROMPT, negative_prompt=NEGATIVE_PROMPT, height=IMAGE_SIDE["tiny"],
                    width=IMAGE_SIDE["tiny"], num_inference_steps=4, guidance_scale=5.0, max_sequence_length=64)

register_zoo_model(ZooModel(name="ovis-image", kind="diffusion", reference_class="diffusers.OvisImagePipeline",
                            builder=build_ovis_image, sizes=SIZES, call_kwargs=_CALL_KWARGS, sides=IMAGE_SIDE,
                            description="Ovis-Image: Qwen3 text encoder, FLUX-style MMDiT, FLUX.1 VAE"))
