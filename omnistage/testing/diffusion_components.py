"""Tiny components the diffusion zoo builders share: VAEs, text encoders, schedulers.

Each constructor builds the real diffusers/transformers class from a tiny config. They
draw their initial weights from torch's default generator, so a builder seeds once
(`seed_everything`) and then constructs its modules in a fixed order.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

# Image side each zoo size is meant to be called with.
IMAGE_SIDE = {"tiny": 64, "small": 256}


def seed_everything(seed: int) -> None:
    """Seed torch's default generator: every module below draws its init from it."""
    import torch

    torch.manual_seed(seed)


def fill_placeholders(*params) -> None:
    """Give placeholder parameters (Z-Image's pad tokens) seeded values.

    Real checkpoints have learned values there. Some diffusers versions create them with
    `torch.empty`, which keeps whatever memory held: neither deterministic nor NaN-free.
    """
    import torch

    with torch.no_grad():
        for p in params:
            p.normal_(mean=0.0, std=0.02)


def save_pipeline(pipe, out_dir: Path) -> None:
    """The pipeline's own `save_pretrained`: model_index.json plus one folder per component."""
    pipe.save_pretrained(out_dir, safe_serialization=True)


def autoencoder_kl(size: str, *, scaling_factor: float, shift_factor: float | None, latent_channels: int = 16,
                   quant_conv: bool = False):
    """An `AutoencoderKL` with the real 8x downsampling (4 blocks): 16 channels without quant
    convs as in Flux/SD3/Z-Image, or SDXL's 4 channels with them."""
    from diffusers import AutoencoderKL

    channels = {"tiny": (8, 8, 16, 16), "small": (16, 32, 64, 64)}[size]
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        block_out_channels=list(channels),
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=8,
        sample_size=IMAGE_SIDE[size],
        scaling_factor=scaling_factor,
        shift_factor=shift_factor,
        use_quant_conv=quant_conv,
        use_post_quant_conv=quant_conv,
        mid_block_add_attention=True,
    )


def flow_match_scheduler(**config):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(**config)


def _qwen_vl_ids(tokenizer) -> dict[str, int]:
    """The Qwen2.5-VL special-token ids, looked up in the tiny tokenizer."""
    names = {
        "vision_start_token_id": "<|vision_start|>",
        "vision_end_token_id": "<|vision_end|>",
        "image_token_id": "<|image_pad|>",
        "video_token_id": "<|video_pad|>",
    }
    return {key: tokenizer.convert_tokens_to_ids(tok) for key, tok in names.items()}


def qwen2_5_vl_text_encoder(tokenizer, *, hidden_size: int, num_layers: int, vision_depth: int):
    """A `Qwen2_5_VLForConditionalGeneration` sized to the tiny tokenizer.

    bos/eos/pad are the tokenizer's `<|endoftext|>` so they sit inside the vocab (the
    real ids 151643/151645 would not, and transformers warns about that).
    """
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    vocab_size = padded_vocab_size(tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    num_heads = 2
    head_dim = hidden_size // num_heads
    # M-RoPE splits head_dim/2 rotary frequencies over (time, height, width), like the
    # real [16, 24, 24] for head_dim 128.
    half = head_dim // 2
    mrope_section = [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]
    config = Qwen2_5_VLConfig(
        text_config={
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_heads,
            "vocab_size": vocab_size,
            "max_position_embeddings": 4096,
            "bos_token_id": eos,
            "eos_token_id": eos,
            "pad_token_id": eos,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": mrope_section},
        },
        vision_config={
            "depth": vision_depth,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": hidden_size,
            "fullatt_block_indexes": [vision_depth - 1],
        },
        tie_word_embeddings=False,
        **_qwen_vl_ids(tokenizer),
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def qwen3_text_encoder(tokenizer, *, hidden_size: int):
    """A 2-layer `Qwen3Model` sized to the tiny tokenizer (Z-Image, Ovis-Image); bos/eos/pad
    are its `<|endoftext|>`."""
    from transformers import Qwen3Config, Qwen3Model

    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return Qwen3Model(
        Qwen3Config(
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=hidden_size // 2,
            vocab_size=padded_vocab_size(tokenizer),
            max_position_embeddings=4096,
            bos_token_id=eos,
            eos_token_id=eos,
            pad_token_id=eos,
            tie_word_embeddings=True,
        )
    ).eval()


def padded_vocab_size(tokenizer, multiple: int = 64) -> int:
    """Embedding rows for `tokenizer`: every id fits, rounded up like real checkpoints do."""
    return -(-len(tokenizer) // multiple) * multiple


def clip_text_encoder(tokenizer, *, hidden_size: int, projection_dim: int | None = None):
    """A 2-layer CLIP text tower; with `projection_dim`, the `WithProjection` class SD3 uses.

    bos/eos/pad come from the tokenizer so the pooled output is read at the real eos.
    """
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=padded_vocab_size(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        projection_dim=projection_dim or hidden_size,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=tokenizer.model_max_length,
        hidden_act="quick_gelu",
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    cls = CLIPTextModelWithProjection if projection_dim else CLIPTextModel
    return cls(config).eval()


def t5_encoder(tokenizer, *, d_model: int, umt5: bool = False):
    """A 2-layer T5 v1.1-style encoder (gated GELU); `umt5` picks Wan's `UMT5EncoderModel`."""
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    config_cls, model_cls = (UMT5Config, UMT5EncoderModel) if umt5 else (T5Config, T5EncoderModel)
    num_heads = 2
    config = config_cls(
        vocab_size=padded_vocab_size(tokenizer),
        d_model=d_model,
        d_kv=d_model // num_heads,
        d_ff=2 * d_model,
        num_layers=2,
        num_heads=num_heads,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    return model_cls(config).eval()


def sd3_text_encoders(tokenizers, *, clip_hidden: int, t5_hidden: int) -> dict:
    """SD3's text components (two CLIPs with projections, then T5) with their tokenizers, built
    in that order; HiDream-I1 takes the same three before its Llama."""
    tokenizer, tokenizer_2, tokenizer_3 = tokenizers
    return dict(
        text_encoder=clip_text_encoder(tokenizer, hidden_size=clip_hidden, projection_dim=clip_hidden),
        tokenizer=tokenizer,
        text_encoder_2=clip_text_encoder(tokenizer_2, hidden_size=clip_hidden, projection_dim=clip_hidden),
        tokenizer_2=tokenizer_2,
        text_encoder_3=t5_encoder(tokenizer_3, d_model=t5_hidden),
        tokenizer_3=tokenizer_3,
    )


@contextlib.contextmanager
def quiet_diffusers():
    """Silence diffusers' warnings for a block (then restore the previous level)."""
    from diffusers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def write_json(path: Path, data: dict) -> None:
    """JSON the way diffusers and transformers write their configs (sorted, indent 2)."""
    import json

    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
