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


def build_sdxl(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    dims = _SDXL[size]
    clip = dims["clip_hidden"]
    seed_everything(seed)
    tokenizer, tokenizer_2 = build_clip_tokenizer(), build_clip_tokenizer()
    unet = UNet2DConditionModel(
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
        cross_attention_dim=2 * clip,  # CLIP-L and CLIP-G hidden states side by side
        addition_embed_type="text_time",
        addition_time_embed_dim=dims["time_dim"],
        # Six micro-conditioning numbers (original size, crop corner, target size), then the pooled prompt.
        projection_class_embeddings_input_dim=6 * dims["time_dim"] + clip,
        norm_num_groups=8,
    )
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
