"""Diffusion zoo builders: random-weight diffusers `model_index.json` folders.

Each family has one builder `(out_dir, size, seed)` that constructs the real diffusers
and transformers classes from tiny configs (shared pieces in `diffusion_components.py`),
seeds every weight, and writes the folder with the pipeline's own `save_pretrained`, so
`diffusers.<Pipeline>.from_pretrained` (and `DiffusionPipeline.from_pretrained`) is what
loads it.

Sizes:
- `tiny`: 64x64 (video 64x64, 9 frames), 4 steps well under a second on 2 cores.
- `small`: 256x256 (video 128x128, 9 frames), a few million parameters, so compute
  rather than Python overhead dominates a step.

Facts a pipeline needs at run time (scheduler settings, tokenizer special tokens, VAE
latent statistics) are written into the checkpoint, copied from the real checkpoints
where it matters, so no caller has to re-declare them.

Each family registers reasonable kwargs for calling its reference diffusers pipeline on
the `tiny` size (`omnistage.testing.call_kwargs(name)`); families that edit or animate an image also need an
`image=` argument, for which `default_input_image()` gives a deterministic one.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import (
    IMAGE_SIDE,
    autoencoder_kl,
    clip_text_encoder,
    fill_placeholders,
    flow_match_scheduler,
    qwen2_5_vl_text_encoder,
    qwen3_text_encoder,
    quiet_diffusers,
    save_pipeline,
    sd3_text_encoders,
    seed_everything,
    t5_encoder,
    write_json,
)
from omnistage.testing.tokenizers import build_clip_tokenizer, build_qwen2_tokenizer, build_t5_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")

# Video side and number of frames each size is meant to be called with.
VIDEO_SIDE = {"tiny": 64, "small": 128}
NUM_FRAMES = 9

PROMPT = "a photo of a cat sitting on a red chair"
NEGATIVE_PROMPT = "bad quality, blurry"


# --------------------------------------------------------------------------------------
# Z-Image (ZImagePipeline): Qwen3 text encoder, single-stream DiT, 16-channel AutoencoderKL
# --------------------------------------------------------------------------------------

_Z_IMAGE = {
    # dim = n_heads * head_dim; axes_dims splits head_dim over (caption/frame, h, w).
    "tiny": dict(text_hidden=32, dim=32, n_heads=2, n_layers=2, axes_dims=[8, 4, 4]),
    "small": dict(text_hidden=64, dim=128, n_heads=4, n_layers=4, axes_dims=[8, 12, 12]),
}


def build_z_image(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import ZImagePipeline, ZImageTransformer2DModel

    dims = _Z_IMAGE[size]
    seed_everything(seed)
    tokenizer = build_qwen2_tokenizer()
    text_encoder = qwen3_text_encoder(tokenizer, hidden_size=dims["text_hidden"])
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=16,
        dim=dims["dim"],
        n_layers=dims["n_layers"],
        n_refiner_layers=1,
        n_heads=dims["n_heads"],
        n_kv_heads=dims["n_heads"],
        qk_norm=True,
        cap_feat_dim=dims["text_hidden"],  # the pipeline feeds hidden_states[-2] of the text encoder
        rope_theta=256.0,
        t_scale=1000.0,
        axes_dims=dims["axes_dims"],
        axes_lens=[1024, 512, 512],
    )
    fill_placeholders(transformer.x_pad_token, transformer.cap_pad_token)
    # Z-Image's VAE is the Flux one: same latent scaling and shift.
    vae = autoencoder_kl(size, scaling_factor=0.3611, shift_factor=0.1159)
    # Z-Image-Turbo's scheduler_config.json: a static shift of 3.
    scheduler = flow_match_scheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
    pipe = ZImagePipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
    )
    save_pipeline(pipe, out_dir)


# --------------------------------------------------------------------------------------
# Qwen-Image (QwenImagePipeline): Qwen2.5-VL text encoder, MMDiT, causal-3D VAE
# --------------------------------------------------------------------------------------

_QWEN_IMAGE = {
    "tiny": dict(text_hidden=32, heads=2, head_dim=16, layers=2, axes=(4, 6, 6)),
    "small": dict(text_hidden=64, heads=4, head_dim=32, layers=4, axes=(8, 12, 12)),
}
_QWEN_IMAGE_VAE = {
    "tiny": dict(vae_base=8, vae_mult=[1, 2, 2, 2], vae_res_blocks=1),
    "small": dict(vae_base=16, vae_mult=[1, 2, 2, 2], vae_res_blocks=1),
}

# Qwen-Image's scheduler_config.json: resolution-dependent (dynamic) shift with an
# exponential time shift and a terminal sigma of 0.02.
_QWEN_IMAGE_SCHEDULER = dict(
    num_train_timesteps=1000,
    shift=1.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=0.9,
    base_image_seq_len=256,
    max_image_seq_len=8192,
    shift_terminal=0.02,
    time_shift_type="exponential",
)


def _qwen_image_components(dims: dict, *, vision_depth: int, image_channels: int = 3, **transformer_options):
    """The components Qwen-Image and Qwen-Image-Edit share (the edit model reuses them);
    Qwen-Image-Layered's VAE reads RGBA (`image_channels=4`) and its transformer takes options."""
    from diffusers import QwenImageTransformer2DModel

    tokenizer = build_qwen2_tokenizer()
    text_encoder = qwen2_5_vl_text_encoder(
        tokenizer, hidden_size=dims["text_hidden"], num_layers=2, vision_depth=vision_depth
    )
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,  # 16 latent channels packed 2x2
        out_channels=16,
        num_layers=dims["layers"],
        attention_head_dim=dims["head_dim"],
        num_attention_heads=dims["heads"],
        joint_attention_dim=dims["text_hidden"],
        guidance_embeds=False,
        axes_dims_rope=dims["axes"],
        **transformer_options,
    )
    vae = qwen_image_vae(dims, image_channels)
    scheduler = flow_match_scheduler(**_QWEN_IMAGE_SCHEDULER)
    return dict(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)


def qwen_image_vae(dims: dict, image_channels: int = 3):
    """Qwen-Image's causal-3D VAE (also Krea 2's) from `dims`' "vae_base", "vae_mult" and "vae_res_blocks"."""
    from diffusers import AutoencoderKLQwenImage

    # Zero-mean unit-std latents: random weights have no learned latent statistics.
    return AutoencoderKLQwenImage(
        base_dim=dims["vae_base"],
        z_dim=16,
        dim_mult=dims["vae_mult"],
        num_res_blocks=dims["vae_res_blocks"],
        # One entry per downsampling (the spatial factor is 2**len): 3 gives the real 8x.
        temperal_downsample=[False] + [True] * (len(dims["vae_mult"]) - 2),
        input_channels=image_channels,
        latents_mean=[0.0] * 16,
        latents_std=[1.0] * 16,
    )


def build_qwen_image(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import QwenImagePipeline

    seed_everything(seed)
    pipe = QwenImagePipeline(**_qwen_image_components(dict(_QWEN_IMAGE[size], **_QWEN_IMAGE_VAE[size]), vision_depth=1))
    save_pipeline(pipe, out_dir)


# --------------------------------------------------------------------------------------
# Qwen-Image-Edit (QwenImageEditPipeline): Qwen-Image plus the input image, seen twice
# --------------------------------------------------------------------------------------
#
# The text encoder reads the input image through its vision tower (via a Qwen2VLProcessor)
# and the transformer reads its VAE latents next to the noise. What stood in the way:
#
# - transformers 5.24 cannot construct a `Qwen2VLProcessor` without torchvision. Its
#   `video_processor` slot is type-checked against `VideoProcessorMixin`, which transformers
#   only exports when torchvision imports (every video processor is torchvision-based), so
#   both `Qwen2VLProcessor(...)` and `Qwen2VLProcessor.from_pretrained` fail here. The
#   image half alone works: `Qwen2VLImageProcessor` falls back to `Qwen2VLImageProcessorPil`.
# - So the pipeline is saved with `processor=None`, the `processor/` folder is written from
#   its parts in the Hub's layout (tokenizer files, `preprocessor_config.json`,
#   `video_preprocessor_config.json`), and model_index.json names `Qwen2VLProcessor` as the
#   real checkpoint does. Where torchvision is installed, `from_pretrained(path)` loads it
#   whole; without it, load with `from_pretrained(path, processor=None)` and build the
#   text-encoder inputs from `Qwen2VLImageProcessorPil` and the tokenizer in `processor/`.
# - The pipeline resizes every input image to about 1024x1024 before the VAE sees it,
#   whatever height/width are asked for, so even `tiny` VAE-encodes a 1024x1024 image.
#   The processor caps what the vision tower sees at a few patches instead, and the VAE
#   downsamples 16x rather than the real 8x (a fourth downsampling; the pipeline reads the
#   factor from the VAE config), so the transformer attends over 1024 image tokens, not
#   4096. A tiny edit still costs about ten tiny Qwen-Image generations, nearly all of it
#   the VAE encode.

# At 1024x1024 the VAE encoder's cost is its full-resolution convolutions: keep them
# narrow and few. Width 8 is also the cheapest, as torch runs conv3d with fewer input
# channels on a slow path; no residual blocks between the encoder's downsamplings (the
# decoder keeps one per level) cut a tiny encode about 5x. Without those blocks, which
# are where the width changes, the width must stay constant.
_QWEN_EDIT_VAE = {
    "tiny": dict(vae_base=8, vae_mult=[1, 1, 1, 1, 1], vae_res_blocks=0),
    "small": dict(vae_base=16, vae_mult=[1, 1, 1, 1, 1], vae_res_blocks=0),
}

# Pixels the vision tower sees (min = max): 56x56 is 2x2 merged image tokens.
_QWEN_EDIT_VISION_PIXELS = {"tiny": 56 * 56, "small": 112 * 112}


def build_qwen_image_edit(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import QwenImageEditPipeline

    seed_everything(seed)
    components = _qwen_image_components(dict(_QWEN_IMAGE[size], **_QWEN_EDIT_VAE[size]), vision_depth=2)
    save_qwen_edit_pipeline(QwenImageEditPipeline(**components, processor=None), out_dir, components["tokenizer"],
                            _QWEN_EDIT_VISION_PIXELS[size])


def save_qwen_edit_pipeline(pipe, out_dir: Path, tokenizer, vision_pixels: int) -> None:
    """Save a Qwen-Image-Edit-style pipeline built with processor=None, then write its
    `processor/` folder from its parts and name it in model_index.json."""
    import json

    with quiet_diffusers():  # it warns that the processor=None it was given cannot be saved
        save_pipeline(pipe, out_dir)
    write_qwen2_vl_processor(out_dir / "processor", tokenizer, vision_pixels)
    index_path = out_dir / "model_index.json"
    index = json.loads(index_path.read_text())
    index["processor"] = ["transformers", "Qwen2VLProcessor"]
    write_json(index_path, index)


def write_qwen2_vl_processor(folder: Path, tokenizer, num_pixels: int,
                             processor_class: str = "Qwen2VLProcessor") -> None:
    """A Qwen2VLProcessor (or `processor_class`, e.g. Qwen2_5_VLProcessor) folder in the Hub
    layout, written without constructing one."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer.save_pretrained(folder)
    image_config = Qwen2VLImageProcessorPil(size={"shortest_edge": num_pixels, "longest_edge": num_pixels}).to_dict()
    image_config.update(processor_class=processor_class, image_processor_type="Qwen2VLImageProcessor")
    write_json(folder / "preprocessor_config.json", image_config)
    video_config = {k: v for k, v in image_config.items() if k != "image_processor_type"}
    video_config["video_processor_type"] = "Qwen2VLVideoProcessor"
    write_json(folder / "video_preprocessor_config.json", video_config)


# --------------------------------------------------------------------------------------
# Flux (FluxPipeline, FLUX.1-dev style): CLIP + T5 encoders, MMDiT with guidance embedding
# --------------------------------------------------------------------------------------

_FLUX = {
    "tiny": dict(clip_hidden=16, t5_hidden=32, heads=2, head_dim=16, layers=1, single_layers=1, axes=(4, 6, 6)),
    "small": dict(clip_hidden=32, t5_hidden=64, heads=4, head_dim=32, layers=2, single_layers=4, axes=(8, 12, 12)),
}

# FLUX.1-dev's scheduler_config.json: resolution-dependent (dynamic) shift.
_FLUX_SCHEDULER = dict(
    num_train_timesteps=1000,
    shift=3.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=1.15,
    base_image_seq_len=256,
    max_image_seq_len=4096,
)


def flux_components(size: str) -> dict:
    """FLUX.1-dev's components at `size` (FLUX.1-Kontext's checkpoint has the same ones), drawn
    from torch's default generator in a fixed order: seed first."""
    from diffusers import FluxTransformer2DModel

    dims = _FLUX[size]
    tokenizer, tokenizer_2 = build_clip_tokenizer(), build_t5_tokenizer()
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,  # 16 latent channels packed 2x2
        num_layers=dims["layers"],
        num_single_layers=dims["single_layers"],
        attention_head_dim=dims["head_dim"],
        num_attention_heads=dims["heads"],
        joint_attention_dim=dims["t5_hidden"],
        pooled_projection_dim=dims["clip_hidden"],
        guidance_embeds=True,  # FLUX.1-dev is guidance-distilled: one transformer call per step
        axes_dims_rope=dims["axes"],
    )
    return dict(
        scheduler=flow_match_scheduler(**_FLUX_SCHEDULER),
        vae=autoencoder_kl(size, scaling_factor=0.3611, shift_factor=0.1159),
        text_encoder=clip_text_encoder(tokenizer, hidden_size=dims["clip_hidden"]),
        tokenizer=tokenizer,
        text_encoder_2=t5_encoder(tokenizer_2, d_model=dims["t5_hidden"]),
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    )


def build_flux(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import FluxPipeline

    seed_everything(seed)
    save_pipeline(FluxPipeline(**flux_components(size)), out_dir)


# --------------------------------------------------------------------------------------
# Stable Diffusion 3 (StableDiffusion3Pipeline): two CLIP-with-projection encoders + T5, MMDiT
# --------------------------------------------------------------------------------------

# The pipeline zero-pads the concatenated CLIP hidden states to the T5 width, so
# t5_hidden >= 2 * clip_hidden; the pooled projection is both CLIP projections side by side.
_SD3 = {
    "tiny": dict(clip_hidden=16, t5_hidden=32, heads=2, head_dim=16, layers=2),
    "small": dict(clip_hidden=32, t5_hidden=64, heads=4, head_dim=32, layers=4),
}


def build_sd3(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline

    dims = _SD3[size]
    seed_everything(seed)
    tokenizer, tokenizer_2, tokenizer_3 = build_clip_tokenizer(), build_clip_tokenizer(), build_t5_tokenizer()
    clip = dims["clip_hidden"]
    latent_side = IMAGE_SIDE[size] // 8
    transformer = SD3Transformer2DModel(
        sample_size=latent_side,  # the pipeline's default height/width is sample_size * 8
        patch_size=2,
        in_channels=16,
        num_layers=dims["layers"],
        attention_head_dim=dims["head_dim"],
        num_attention_heads=dims["heads"],
        joint_attention_dim=dims["t5_hidden"],
        caption_projection_dim=dims["heads"] * dims["head_dim"],
        pooled_projection_dim=2 * clip,
        out_channels=16,
        # In patches: room for twice the default side (the real 96 covers 1536px).
        pos_embed_max_size=latent_side,
    )
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        # SD3's scheduler_config.json: a static shift of 3.
        scheduler=flow_match_scheduler(num_train_timesteps=1000, shift=3.0),
        vae=autoencoder_kl(size, scaling_factor=1.5305, shift_factor=0.0609),
        **sd3_text_encoders((tokenizer, tokenizer_2, tokenizer_3), clip_hidden=clip, t5_hidden=dims["t5_hidden"]),
    )
    save_pipeline(pipe, out_dir)


# --------------------------------------------------------------------------------------
# Wan 2.1 (WanPipeline, WanImageToVideoPipeline): UMT5 encoder, 3D DiT, causal-3D VAE
# --------------------------------------------------------------------------------------

_WAN = {
    "tiny": dict(text_hidden=32, heads=2, head_dim=12, layers=2, ffn=32, vae_base=4, vae_mult=[1, 1, 1, 1]),
    "small": dict(text_hidden=64, heads=4, head_dim=24, layers=4, ffn=256, vae_base=16, vae_mult=[1, 2, 2, 2]),
}


def _wan_scheduler():
    """Wan 2.1's scheduler_config.json: UniPC over flow-matching sigmas, shift 3 (480p)."""
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(
        num_train_timesteps=1000,
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        flow_shift=3.0,
        solver_order=2,
        solver_type="bh2",
        lower_order_final=True,
        final_sigmas_type="zero",
    )


def wan_vae(size: str):
    """The Wan 2.1 causal-3D VAE (8x spatial, 4x temporal), which SANA-Video uses too."""
    from diffusers import AutoencoderKLWan

    dims = _WAN[size]
    # Zero-mean unit-std latents: random weights have no learned latent statistics.
    return AutoencoderKLWan(
        base_dim=dims["vae_base"],
        z_dim=16,
        dim_mult=dims["vae_mult"],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * 16,
        latents_std=[1.0] * 16,
    )


def _wan_components(size: str, *, in_channels: int, image_dim: int | None = None, vace: bool = False) -> dict:
    """The components Wan T2V, I2V and VACE share; I2V adds image channels and image
    cross-attention, VACE the control blocks (`WanVACETransformer3DModel`)."""
    from diffusers import WanTransformer3DModel, WanVACETransformer3DModel

    dims = _WAN[size]
    tokenizer = build_t5_tokenizer()
    inner = dims["heads"] * dims["head_dim"]
    # VACE: a control block beside the first and every other DiT block; its input is the
    # control video's inactive and reactive latents (2 x 16) and the 8 x 8 mask (64).
    model, control = ((WanVACETransformer3DModel, dict(vace_layers=list(range(0, dims["layers"], 2)),
                                                       vace_in_channels=96))
                      if vace else (WanTransformer3DModel, {}))
    transformer = model(
        **control,
        patch_size=(1, 2, 2),
        num_attention_heads=dims["heads"],
        attention_head_dim=dims["head_dim"],
        in_channels=in_channels,
        out_channels=16,
        text_dim=dims["text_hidden"],
        freq_dim=256,
        ffn_dim=dims["ffn"],
        num_layers=dims["layers"],
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        image_dim=image_dim,
        added_kv_proj_dim=inner if image_dim else None,
        rope_max_seq_len=1024,
    )
    vae = wan_vae(size)  # after the transformer: the draw order fixes the weights
    return dict(
        tokenizer=tokenizer,
        text_encoder=t5_encoder(tokenizer, d_model=dims["text_hidden"], umt5=True),
        vae=vae,
        scheduler=_wan_scheduler(),
        transformer=transformer,
    )


def build_wan_t2v(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import WanPipeline

    seed_everything(seed)
    pipe = WanPipeline(**_wan_components(size, in_channels=16))
    save_pipeline(pipe, out_dir)


# Wan 2.1 I2V conditions on a CLIP ViT's penultimate hidden states (ViT-H/14 at 224px in
# the real model; a 2-layer ViT at 32px here).
_WAN_IMAGE_ENCODER = {"tiny": dict(hidden=16, image=32, patch=8), "small": dict(hidden=32, image=64, patch=8)}


def build_wan_i2v(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import WanImageToVideoPipeline
    from transformers import CLIPImageProcessorPil, CLIPVisionConfig, CLIPVisionModel

    enc = _WAN_IMAGE_ENCODER[size]
    seed_everything(seed)
    # 16 noise + 4 first-frame mask + 16 conditioning-latent channels, as in Wan 2.1 I2V.
    components = _wan_components(size, in_channels=36, image_dim=enc["hidden"])
    image_encoder = CLIPVisionModel(
        CLIPVisionConfig(
            hidden_size=enc["hidden"],
            intermediate_size=2 * enc["hidden"],
            projection_dim=enc["hidden"],
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=enc["image"],
            patch_size=enc["patch"],
            hidden_act="gelu",
        )
    ).eval()
    # The PIL backend of CLIPImageProcessor, named as such in model_index.json: it needs no
    # torchvision, and the folder comes out the same whether torchvision is installed or
    # not (plain `CLIPImageProcessor` would be the torchvision class where it is).
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": enc["image"]}, crop_size={"height": enc["image"], "width": enc["image"]}
    )
    pipe = WanImageToVideoPipeline(**components, image_encoder=image_encoder, image_processor=image_processor)
    save_pipeline(pipe, out_dir)


# --------------------------------------------------------------------------------------
# Registration and call defaults
# --------------------------------------------------------------------------------------

_T2I_DEFAULTS = dict(
    prompt=PROMPT,
    height=IMAGE_SIDE["tiny"],
    width=IMAGE_SIDE["tiny"],
    num_inference_steps=4,
)
# Classifier-free guidance runs the transformer on a negative prompt too.
_CFG = dict(negative_prompt=NEGATIVE_PROMPT)

_T2V_DEFAULTS = dict(
    _CFG,
    prompt=PROMPT,
    height=VIDEO_SIDE["tiny"],
    width=VIDEO_SIDE["tiny"],
    num_frames=NUM_FRAMES,
    num_inference_steps=4,
    guidance_scale=5.0,
    max_sequence_length=32,
)

_CALL_KWARGS: dict[str, dict] = {
    "z-image": dict(_T2I_DEFAULTS, **_CFG, guidance_scale=3.0, max_sequence_length=64),
    "qwen-image": dict(_T2I_DEFAULTS, **_CFG, true_cfg_scale=2.0, max_sequence_length=64),
    # Also needs image=: default_input_image() gives one.
    "qwen-image-edit": dict(_T2I_DEFAULTS, **_CFG, true_cfg_scale=2.0, max_sequence_length=64),
    # FLUX.1-dev is guidance-distilled: guidance_scale feeds its guidance embedding. True
    # CFG stays off as Flux-dev is run; the negative prompt is there for callers who turn
    # it on with true_cfg_scale > 1.
    "flux": dict(_T2I_DEFAULTS, **_CFG, guidance_scale=3.5, true_cfg_scale=1.0, max_sequence_length=64),
    "sd3": dict(_T2I_DEFAULTS, **_CFG, guidance_scale=5.0, max_sequence_length=64),
    "wan-t2v": dict(_T2V_DEFAULTS),
    # Also needs image=: default_input_image() gives one.
    "wan-i2v": dict(_T2V_DEFAULTS),
}


def default_input_image(side: int = IMAGE_SIDE["tiny"]):
    """A deterministic RGB gradient for families that take an input image."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:side, 0:side]
    rgb = np.stack([x * 255 // max(side - 1, 1), y * 255 // max(side - 1, 1), (x + y) * 127 // max(side - 1, 1)], -1)
    return Image.fromarray(rgb.astype(np.uint8), "RGB")


def _register(name: str, reference_class: str, builder, description: str) -> None:
    register_zoo_model(
        ZooModel(
            name=name,
            kind="diffusion",
            reference_class=reference_class,
            builder=builder,
            sizes=SIZES,
            description=description,
            call_kwargs=_CALL_KWARGS[name],
            sides=VIDEO_SIDE if "num_frames" in _CALL_KWARGS[name] else IMAGE_SIDE,
        )
    )


_register("z-image", "diffusers.ZImagePipeline", build_z_image, "Z-Image: Qwen3 text encoder + single-stream DiT")
_register(
    "qwen-image", "diffusers.QwenImagePipeline", build_qwen_image, "Qwen-Image: Qwen2.5-VL text encoder + MMDiT"
)
_register(
    "qwen-image-edit",
    "diffusers.QwenImageEditPipeline",
    build_qwen_image_edit,
    "Qwen-Image-Edit: Qwen-Image conditioned on an input image (Qwen2.5-VL vision tower + VAE latents)",
)
_register("flux", "diffusers.FluxPipeline", build_flux, "FLUX.1-dev: CLIP + T5 encoders, guidance-distilled MMDiT")
_register("sd3", "diffusers.StableDiffusion3Pipeline", build_sd3, "SD3: two CLIP-with-projection encoders + T5, MMDiT")
_register("wan-t2v", "diffusers.WanPipeline", build_wan_t2v, "Wan 2.1 text-to-video: UMT5 encoder + 3D DiT")
_register(
    "wan-i2v",
    "diffusers.WanImageToVideoPipeline",
    build_wan_i2v,
    "Wan 2.1 image-to-video: UMT5 + CLIP vision encoders, 3D DiT with image cross-attention",
)
