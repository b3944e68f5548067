"""HunyuanVideo-1.5 zoo builders (HunyuanVideo15Pipeline, HunyuanVideo15ImageToVideoPipeline):
random-weight diffusers folders.

The real checkpoint's parts at tiny sizes: a Qwen2.5-VL text model (`Qwen2_5_VLTextModel`,
read two layers from the top) with Qwen2's tokenizer, a ByT5 encoder for quoted glyph text
(`T5EncoderModel` + the byte-level `ByT5Tokenizer`), the dual-stream 3D DiT, the 16x / 4x
compressing causal VAE, flow-matching Euler with the 480p shift, and the `guider`
(`ClassifierFreeGuidance`) that carries the CFG scale.

Fixed by the pipeline, not the checkpoint, and so paid even by `tiny`: every prompt is padded
to 1000 Qwen tokens (after a 108-token template crop) and 256 ByT5 bytes, and the transformer
always attends over 729 image-embedding slots (zeroed and masked for text-to-video), so each
transformer call carries about 2000 text tokens next to the video's. The ByT5 projection has a
fixed 2048-wide hidden layer.

Each registers its reference call for `tiny` (`omnistage.testing.call_kwargs`; no
guidance_scale: diffusers reads it from the guider).
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import (
    padded_vocab_size,
    save_pipeline,
    seed_everything,
    t5_encoder,
)
from omnistage.testing.tokenizers import build_qwen2_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")
VIDEO_SIDE = {"tiny": 64, "small": 128}
NUM_FRAMES = 9
PROMPT = "a photo of a cat sitting on a red chair"
NEGATIVE_PROMPT = "bad quality, blurry"

# heads * head_dim = the DiT width; rope_axes split head_dim over (frame, height, width).
_DIMS = {
    "tiny": dict(text_hidden=32, byt5_hidden=16, image_dim=16, heads=2, head_dim=16, layers=2,
                 rope_axes=(4, 6, 6), latent_channels=8, vae_channels=(8, 8, 16, 16, 16)),
    "small": dict(text_hidden=64, byt5_hidden=32, image_dim=32, heads=4, head_dim=24, layers=4,
                  rope_axes=(8, 8, 8), latent_channels=16, vae_channels=(16, 32, 32, 64, 64)),
}


def _qwen2_5_vl_text_model(tokenizer, hidden_size: int):
    """A 2-layer `Qwen2_5_VLTextModel` (the checkpoint's text_encoder has no LM head and no
    vision tower). bos/eos/pad are the tiny tokenizer's `<|endoftext|>`, inside its vocab."""
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    num_heads = 2
    half = hidden_size // num_heads // 2
    # M-RoPE splits head_dim/2 frequencies over (time, height, width), like the real [16, 24, 24].
    mrope_section = [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]
    config = Qwen2_5_VLTextConfig(
        vocab_size=padded_vocab_size(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=2048,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": mrope_section},
    )
    return Qwen2_5_VLTextModel(config).eval()


def _components(size: str, task_type: str) -> dict:
    """The components text-to-video and image-to-video share, in construction order."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        ClassifierFreeGuidance,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Transformer3DModel,
    )
    from transformers import ByT5Tokenizer

    dims = _DIMS[size]
    # The pipeline pads prompts to 1000 + 108 tokens: the tokenizer must allow that many.
    tokenizer = build_qwen2_tokenizer(model_max_length=2048)
    tokenizer_2 = ByT5Tokenizer()
    channels = dims["latent_channels"]
    transformer = HunyuanVideo15Transformer3DModel(
        # The noise, the (zero for text-to-video) condition latents and their mask channel.
        in_channels=2 * channels + 1,
        out_channels=channels,
        num_attention_heads=dims["heads"],
        attention_head_dim=dims["head_dim"],
        num_layers=dims["layers"],
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=dims["text_hidden"],
        text_embed_2_dim=dims["byt5_hidden"],
        image_embed_dim=dims["image_dim"],
        rope_axes_dim=dims["rope_axes"],
        # The pixel size default requests are bucketed around (the real 480p model: 640).
        target_size=VIDEO_SIDE[size],
        task_type=task_type,
    )
    vae = AutoencoderKLHunyuanVideo15(
        latent_channels=channels,
        block_out_channels=dims["vae_channels"],
        layers_per_block=1,
        spatial_compression_ratio=16,
        temporal_compression_ratio=4,
    )
    return dict(
        text_encoder=_qwen2_5_vl_text_model(tokenizer, dims["text_hidden"]),
        tokenizer=tokenizer,
        transformer=transformer,
        vae=vae,
        # The 480p text-to-video scheduler_config.json: Euler over flow sigmas, shift 5.
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=5.0),
        text_encoder_2=t5_encoder(tokenizer_2, d_model=dims["byt5_hidden"]),
        tokenizer_2=tokenizer_2,
        # The 480p text-to-video guider: plain CFG at 6.
        guider=ClassifierFreeGuidance(guidance_scale=6.0),
    )


def build_hunyuan_video(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import HunyuanVideo15Pipeline

    seed_everything(seed)
    save_pipeline(HunyuanVideo15Pipeline(**_components(size, "t2v")), out_dir)


# Image-to-video reads the image through a SigLIP vision tower (so400m at 384 px, 729 tokens,
# in the real model; 2 layers at 32 px, 16 tokens, here) whose width is the transformer's
# image_embed_dim.
_IMAGE_ENCODER = {"tiny": dict(image=32, patch=8), "small": dict(image=64, patch=8)}


def build_hunyuan_video_i2v(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import HunyuanVideo15ImageToVideoPipeline
    from transformers import SiglipImageProcessorPil, SiglipVisionConfig, SiglipVisionModel

    enc, hidden = _IMAGE_ENCODER[size], _DIMS[size]["image_dim"]
    seed_everything(seed)
    components = _components(size, "i2v")
    image_encoder = SiglipVisionModel(
        SiglipVisionConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                           num_attention_heads=2, image_size=enc["image"], patch_size=enc["patch"])
    ).eval()
    # The PIL backend of SiglipImageProcessor: no torchvision needed, the same folder either way.
    feature_extractor = SiglipImageProcessorPil(size={"height": enc["image"], "width": enc["image"]})
    pipe = HunyuanVideo15ImageToVideoPipeline(**components, image_encoder=image_encoder,
                                              feature_extractor=feature_extractor)
    save_pipeline(pipe, out_dir)


_CALL_KWARGS: dict[str, dict] = {
    "hunyuan-video": dict(
        prompt=PROMPT,
        negative_prompt=NEGATIVE_PROMPT,
        height=VIDEO_SIDE["tiny"],
        width=VIDEO_SIDE["tiny"],
        num_frames=NUM_FRAMES,
        num_inference_steps=4,
    ),
    # Also needs image=: omnistage.testing.diffusion_models.default_input_image() gives one
    # (square: the video is 64x64, the target size's square bucket).
    "hunyuan-video-i2v": dict(prompt=PROMPT, negative_prompt=NEGATIVE_PROMPT, num_frames=NUM_FRAMES,
                              num_inference_steps=4),
}

register_zoo_model(
    ZooModel(
        name="hunyuan-video",
        kind="diffusion",
        reference_class="diffusers.HunyuanVideo15Pipeline",
        builder=build_hunyuan_video,
        sizes=SIZES,
        description="HunyuanVideo-1.5 text-to-video: Qwen2.5-VL text model + ByT5, dual-stream 3D DiT, 16x VAE",
        call_kwargs=_CALL_KWARGS["hunyuan-video"],
        sides=VIDEO_SIDE,
    )
)
register_zoo_model(
    ZooModel(
        name="hunyuan-video-i2v",
        kind="diffusion",
        reference_class="diffusers.HunyuanVideo15ImageToVideoPipeline",
        builder=build_hunyuan_video_i2v,
        sizes=SIZES,
        description="HunyuanVideo-1.5 image-to-video: HunyuanVideo-1.5 plus a SigLIP vision tower and the "
                    "VAE-encoded first frame",
        call_kwargs=_CALL_KWARGS["hunyuan-video-i2v"],
    )
)
