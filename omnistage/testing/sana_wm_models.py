"""SANA-WM zoo builder: `SanaWMPipeline`, a camera-controlled image-to-video world model (a Gemma 2
text model, a 3D DiT of gated-delta-net linear attention with a softmax block every
`softmax_every_n`, each reading the camera's ray map and Plücker coordinates, and the LTX-2 VAE).

The tiny VAE has two blocks: 16x spatial, 4x temporal (SANA-WM's LTX-2 VAE: 32x / 8x), so the
camera's Plücker chunks have 6 x 4 channels. The tiny call moves the camera forward, then
forward while turning left: 9 frames, 3 latent frames at 64 x 64.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import fill_placeholders, save_pipeline, seed_everything
from omnistage.testing.diffusion_models import NEGATIVE_PROMPT, PROMPT
from omnistage.testing.ltx2_models import build_gemma_tokenizer, ltx2_video_vae
from omnistage.testing.sana_video_models import gemma2_text_encoder
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")
VIDEO_SIDE = {"tiny": 64, "small": 128}

_DIMS = {
    "tiny": dict(text_hidden=32, hidden=48, heads=2, linear_head_dim=24, layers=2, latent=8, vae=(16, 32)),
    "small": dict(text_hidden=64, hidden=96, heads=4, linear_head_dim=24, layers=4, latent=16, vae=(32, 64)),
}
_TEMPORAL_RATIO = 4  # two VAE blocks


def build_sana_wm(out_dir: Path, size: str, seed: int) -> None:
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, SanaWMPipeline, SanaWMTransformer3DModel

    dims = _DIMS[size]
    seed_everything(seed)
    tokenizer = build_gemma_tokenizer()
    text_encoder = gemma2_text_encoder(tokenizer, dims["text_hidden"])
    transformer = SanaWMTransformer3DModel(
        in_channels=dims["latent"],
        num_layers=dims["layers"],
        hidden_size=dims["hidden"],
        num_attention_heads=dims["heads"],
        linear_head_dim=dims["linear_head_dim"],
        softmax_every_n=2,  # one gated-delta-net block, one softmax block
        chunk_plucker_channels=6 * _TEMPORAL_RATIO,
        chunk_plucker_post_attn_blocks=dims["layers"],
        caption_channels=dims["text_hidden"],
        mlp_ratio=2.0,
    )
    # A trained checkpoint's camera branch steers the video; at init it is near-silent (its
    # Plücker embedding starts at zero): wider seeded weights there, so the camera path shows
    # in the tiny model's video, and seeded values for the other zero-initialised weights.
    with torch.no_grad():
        for name, param in transformer.named_parameters():
            if ("cam" in name or "plucker" in name) and "norm" not in name:
                param.normal_(0.0, 0.3)
    fill_placeholders(*(p for p in transformer.parameters() if not p.any()))
    vae = ltx2_video_vae(dims["latent"], dims["vae"])
    # Flow-matching Euler with a fixed shift (the pipeline steps it with per-token timesteps).
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    pipe = SanaWMPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                          scheduler=scheduler)
    save_pipeline(pipe, out_dir)


# Forward 4 frames, then forward turning left 4: 9 poses; intrinsics in the input image's pixels.
_CALL = dict(
    prompt=PROMPT,
    negative_prompt=NEGATIVE_PROMPT,
    height=VIDEO_SIDE["tiny"],
    width=VIDEO_SIDE["tiny"],
    num_frames=9,
    num_inference_steps=4,
    guidance_scale=5.0,
    max_sequence_length=16,
    action="w-4,jw-4",
    intrinsics=[50.0, 50.0, 32.0, 32.0],
)

register_zoo_model(
    ZooModel(
        name="sana-wm",
        kind="diffusion",
        reference_class="diffusers.SanaWMPipeline",
        builder=build_sana_wm,
        sizes=SIZES,
        description="SANA-WM camera-controlled image-to-video: Gemma 2 text model, camera-conditioned linear-attention "
                    "DiT, LTX-2 VAE",
        # Also needs image=: omnistage.testing.diffusion_models.default_input_image() gives one.
        call_kwargs=_CALL,
        sides=VIDEO_SIDE,
    )
)
