"""SDXL zoo builder: `StableDiffusionXLPipeline` (two CLIP text encoders, a UNet with
text-time conditioning, a 4-channel AutoencoderKL, Euler discrete noise scheduler).

The UNet keeps SDXL's shape at tiny width: a plain down block then a cross-attention one,
`text_time` added conditioning (six size/crop numbers embedded next to the pooled prompt),
linear projections in its transformer blocks. Its cross-attention width is the two CLIP
widths side by side, as the pipeline concatenates their hidden states.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import (
    IMAGE_SIDE,
    autoencoder_kl,
    clip_text_encoder,
    save_pipeline,
    seed_everything,
)
from omnistage.testing.tokenizers import build_clip_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")

_SDXL = {
    "tiny": dict(clip_hidden=16, unet=(16, 32), heads=(2, 4), time_dim=8),
    "small": dict(clip_hidden=32, unet=(32, 64), heads=(2, 4), time_dim=16),
}

# stabilityai/stable-diffusion-xl-base-1.0's scheduler/scheduler_config.json.
_SDXL_SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    prediction_type="epsilon",
    interpolation_type="linear",
    steps_offset=1,
    timestep_spacing="leading",
    use_karras_sigmas=False,
)


def _unet(size: str, *, cross_attention_dim: int, time_numbers: int):
    """SDXL's UNet at tiny width: `time_numbers` micro-conditioning numbers embedded next to the pooled prompt."""
    from diffusers import UNet2DConditionModel

    dims = _SDXL[size]
    return UNet2DConditionModel(
        sample_size=IMAGE_SIDE[size] // 8,  # the pipeline's default height/width is sample_size * 8
        in_channels=4,
        out_channels=4,
        block_out_channels=dims["unet"],
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=dims["heads"],
        transformer_layers_per_block=(1, 1),
        use_linear_projection=True,
        cross_attention_dim=cross_attention_dim,
        addition_embed_type="text_time",
        addition_time_embed_dim=dims["time_dim"],
        projection_class_embeddings_input_dim=time_numbers * dims["time_dim"] + dims["clip_hidden"],
        norm_num_groups=8,
    )


def build_sdxl(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline

    dims = _SDXL[size]
    clip = dims["clip_hidden"]
    seed_everything(seed)
    tokenizer, tokenizer_2 = build_clip_tokenizer(), build_clip_tokenizer()
    unet = _unet(size, cross_attention_dim=2 * clip, time_numbers=6)  # CLIP-L and CLIP-G side by side
    pipe = StableDiffusionXLPipeline(
        unet=unet,
        scheduler=EulerDiscreteScheduler(**_SDXL_SCHEDULER),
        # SDXL's VAE: 4 latent channels, its own scaling factor, no shift, quant convs; like
        # the real one it keeps diffusers' force_upcast=True (it overflows in fp16).
        vae=autoencoder_kl(size, scaling_factor=0.13025, shift_factor=None, latent_channels=4, quant_conv=True),
        text_encoder=clip_text_encoder(tokenizer, hidden_size=clip),
        tokenizer=tokenizer,
        text_encoder_2=clip_text_encoder(tokenizer_2, hidden_size=clip, projection_dim=clip),
        tokenizer_2=tokenizer_2,
        force_zeros_for_empty_prompt=True,  # base-1.0's model_index.json: no negative prompt = zero embeddings
        add_watermarker=False,
    )
    save_pipeline(pipe, out_dir)


PROMPT = "a photo of a cat sitting on a red chair"

_CALL_KWARGS = {
    "sdxl": dict(prompt=PROMPT, negative_prompt="bad quality, blurry", height=IMAGE_SIDE["tiny"],
                 width=IMAGE_SIDE["tiny"], num_inference_steps=4, guidance_scale=5.0),
}

register_zoo_model(ZooModel(name="sdxl", kind="diffusion", reference_class="diffusers.StableDiffusionXLPipeline",
                            builder=build_sdxl, sizes=SIZES, call_kwargs=_CALL_KWARGS["sdxl"], sides=IMAGE_SIDE,
                            description="SDXL base: CLIP-L + CLIP-G text encoders, UNet with text-time conditioning"))


def build_sdxl_refiner(out_dir: Path, size: str, seed: int) -> None:
    """The refiner's layout: only the CLIP-G encoder, a UNet conditioned on its hidden states
    alone and on five micro-conditioning numbers (original size, crop corner, aesthetic score),
    `requires_aesthetics_score` and no zeroed negative prompt, as stable-diffusion-xl-refiner-1.0."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLImg2ImgPipeline

    dims = _SDXL[size]
    clip = dims["clip_hidden"]
    seed_everything(seed)
    tokenizer_2 = build_clip_tokenizer()
    pipe = StableDiffusionXLImg2ImgPipeline(
        unet=_unet(size, cross_attention_dim=clip, time_numbers=5),
        scheduler=EulerDiscreteScheduler(**_SDXL_SCHEDULER),
        vae=autoencoder_kl(size, scaling_factor=0.13025, shift_factor=None, latent_channels=4, quant_conv=True),
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=clip_text_encoder(tokenizer_2, hidden_size=clip, projection_dim=clip),
        tokenizer_2=tokenizer_2,
        requires_aesthetics_score=True,
        force_zeros_for_empty_prompt=False,
        add_watermarker=False,
    )
    save_pipeline(pipe, out_dir)


# The refiner continues a base's latents: the base's call (on the `sdxl` zoo model) with the
# ensemble's split; the refiner's own call adds `image=` (the base's latents) and `denoising_start`.
ENSEMBLE_SPLIT = 0.5
_CALL_KWARGS["sdxl-refiner"] = dict(_CALL_KWARGS["sdxl"], denoising_start=ENSEMBLE_SPLIT)

register_zoo_model(ZooModel(name="sdxl-refiner", kind="diffusion",
                            reference_class="diffusers.StableDiffusionXLImg2ImgPipeline", builder=build_sdxl_refiner,
                            sizes=SIZES, call_kwargs=_CALL_KWARGS["sdxl-refiner"], sides=IMAGE_SIDE,
                            description="SDXL refiner: CLIP-G encoder, UNet with aesthetic-score conditioning "
                                        "(the second expert after the base)"))
