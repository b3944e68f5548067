"""Cosmos3 zoo builder: `Cosmos3OmniPipeline`, one packed mixture-of-transformers over text
tokens and video latents (no separate text encoder: the transformer embeds the token ids) and
the Wan 2.2 VAE (16x spatial: 8x by its blocks, 2x by its patch; 4x temporal).

The tiny model generates video only: no sound tokenizer, no action heads, no guardrail.
Its 64 x 64 video is a 4 x 4 latent, 2 x 2 patches of 2 x 2 per latent frame.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import padded_vocab_size, save_pipeline, seed_everything
from omnistage.testing.diffusion_models import NEGATIVE_PROMPT, PROMPT
from omnistage.testing.tokenizers import build_qwen2_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")
VIDEO_SIDE = {"tiny": 64, "small": 128}

# rope_axes_dim splits head_dim / 2 rotary frequencies over time, height and width.
_DIMS = {
    "tiny": dict(hidden=32, heads=4, kv_heads=2, head_dim=8, rope=[2, 1, 1], layers=2, vae_base=8, z_dim=16),
    "small": dict(hidden=64, heads=4, kv_heads=2, head_dim=16, rope=[4, 2, 2], layers=4, vae_base=16, z_dim=16),
}


def wan22_vae(size: str):
    """The Wan 2.2 VAE layout Cosmos3 uses (a 2 x 2 patch in front of 8x blocks, residual
    shortcuts), with zero-mean unit-std latent statistics (random weights learned none)."""
    from diffusers import AutoencoderKLWan

    dims = _DIMS[size]
    z_dim = dims["z_dim"]
    return AutoencoderKLWan(
        base_dim=dims["vae_base"],
        decoder_base_dim=dims["vae_base"],
        z_dim=z_dim,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        is_residual=True,
        in_channels=12,
        out_channels=12,
        patch_size=2,
        scale_factor_spatial=16,
        scale_factor_temporal=4,
        latents_mean=[0.0] * z_dim,
        latents_std=[1.0] * z_dim,
    )


def build_cosmos3(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import Cosmos3OmniPipeline, Cosmos3OmniTransformer, UniPCMultistepScheduler

    dims = _DIMS[size]
    seed_everything(seed)
    tokenizer = build_qwen2_tokenizer()
    patch = 2
    transformer = Cosmos3OmniTransformer(
        hidden_size=dims["hidden"],
        head_dim=dims["head_dim"],
        num_attention_heads=dims["heads"],
        num_key_value_heads=dims["kv_heads"],
        intermediate_size=2 * dims["hidden"],
        num_hidden_layers=dims["layers"],
        latent_channel=dims["z_dim"],
        latent_patch_size=patch,
        patch_latent_dim=dims["z_dim"] * patch * patch,
        rope_axes_dim=dims["rope"],
        vocab_size=padded_vocab_size(tokenizer),
    )
    vae = wan22_vae(size)  # after the transformer: the draw order fixes the weights
    # UniPC over flow-matching sigmas, as Cosmos3 steps its velocity predictions.
    scheduler = UniPCMultistepScheduler(
        num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0,
        solver_order=2, solver_type="bh2", lower_order_final=True, final_sigmas_type="zero",
    )
    pipe = Cosmos3OmniPipeline(transformer=transformer, text_tokenizer=tokenizer, vae=vae, scheduler=scheduler,
                               enable_safety_checker=False)
    save_pipeline(pipe, out_dir)


# Two latent frames (5 frames); the call names its own defaults' fps so both sides agree.
_CALL = dict(
    prompt=PROMPT,
    negative_prompt=NEGATIVE_PROMPT,
    height=VIDEO_SIDE["tiny"],
    width=VIDEO_SIDE["tiny"],
    num_frames=5,
    fps=24.0,
    num_inference_steps=4,
    guidance_scale=6.0,
)

register_zoo_model(
    ZooModel(
        name="cosmos3",
        kind="diffusion",
        reference_class="diffusers.Cosmos3OmniPipeline",
        builder=build_cosmos3,
        sizes=SIZES,
        description="Cosmos3 text/image/video-to-video: packed text + video mixture-of-transformers, Wan 2.2 VAE",
        # Image-to-video also takes image= (diffusion_models.default_input_image), video-to-video video=.
        call_kwargs=_CALL,
        sides=VIDEO_SIDE,
    )
)
