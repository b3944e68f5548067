"""Helios zoo builder: `HeliosPipeline`, a chunk-autoregressive text-to-video model (UMT5 text
encoder, a Wan-style 3D DiT that also reads short/mid/long history latents, the Wan 2.1 VAE).

Helios generates a video chunk by chunk, each chunk conditioned on the latents of the ones before.
The tiny call generates two chunks of two latent frames (5 frames each) at 64 x 64.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import save_pipeline, seed_everything, t5_encoder
from omnistage.testing.diffusion_models import NEGATIVE_PROMPT, PROMPT, wan_vae
from omnistage.testing.tokenizers import build_t5_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")
# The long-history patch is 8 latent pixels wide (4 x the 2 x 2 patch): sides are whole 64-pixel blocks.
VIDEO_SIDE = {"tiny": 64, "small": 128}

# heads * head_dim = the DiT width; rope_dim splits head_dim over frame, height and width.
_DIMS = {
    "tiny": dict(text_hidden=32, heads=2, head_dim=12, rope=(4, 4, 4), layers=2, ffn=32),
    "small": dict(text_hidden=64, heads=4, head_dim=24, rope=(8, 8, 8), layers=4, ffn=256),
}


def _scheduler():
    """Helios-Base's scheduler: UniPC over one flow-matching stage with dynamic shifting (the
    pipeline passes its own sigmas and the resolution's shift)."""
    from diffusers import HeliosScheduler

    return HeliosScheduler(stages=1, use_dynamic_shifting=True, shift=1.0, scheduler_type="unipc")


def build_helios(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import HeliosPipeline, HeliosTransformer3DModel

    dims = _DIMS[size]
    seed_everything(seed)
    tokenizer = build_t5_tokenizer()
    transformer = HeliosTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=dims["heads"],
        attention_head_dim=dims["head_dim"],
        in_channels=16,
        out_channels=16,
        text_dim=dims["text_hidden"],
        freq_dim=256,
        ffn_dim=dims["ffn"],
        num_layers=dims["layers"],
        rope_dim=dims["rope"],
    )
    vae = wan_vae(size)  # after the transformer: the draw order fixes the weights
    text_encoder = t5_encoder(tokenizer, d_model=dims["text_hidden"], umt5=True)
    pipe = HeliosPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=_scheduler(),
                          transformer=transformer)
    save_pipeline(pipe, out_dir)


# Two chunks of two latent frames (2 x 5 frames, the last frame trimmed as diffusers does: 9).
_CALL = dict(
    prompt=PROMPT,
    negative_prompt=NEGATIVE_PROMPT,
    height=VIDEO_SIDE["tiny"],
    width=VIDEO_SIDE["tiny"],
    num_frames=10,
    num_inference_steps=4,  # per chunk
    guidance_scale=5.0,
    max_sequence_length=16,
    num_latent_frames_per_chunk=2,
)

register_zoo_model(
    ZooModel(
        name="helios",
        kind="diffusion",
        reference_class="diffusers.HeliosPipeline",
        builder=build_helios,
        sizes=SIZES,
        description="Helios text-to-video: UMT5 encoder, chunk-autoregressive 3D DiT over history latents, Wan VAE",
        call_kwargs=_CALL,
        sides=VIDEO_SIDE,
    )
)
