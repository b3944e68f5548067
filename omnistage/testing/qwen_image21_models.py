"""Zoo builder for Qwen-Image 2.1 (QwenImage21Pipeline): Qwen3-VL encoder, single-stream DiT, 16x VAE.

The components are the real classes from tiny configs: a `Qwen3VLForConditionalGeneration`
text encoder (with a one-block vision tower, as the checkpoint carries one for condition
images), a `QwenImage21Transformer2DModel` (block-causal, `causal_condition` on so the text
prefix is KV-cached across steps, as diffusers runs it by default) and an
`AutoencoderKLQwenImage21` with the real 16x downsampling and 64 latent channels, reading
and writing RGBA as the real one does.

transformers cannot construct a `Qwen3VLProcessor` without torchvision (its video half),
and diffusers' pipeline renders the processor's chat template in `__init__`, so the
pipeline is built around a processor assembled from its parts (qwen_image/vl_processor.py)
and saved by its own `save_pretrained`; the `processor/` folder holds the tokenizer (with
a ChatML template), the image processor's config and a video processor config, in the
Hub's layout, and model_index.json names `Qwen3VLProcessor` as the real checkpoint does.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnistage.testing.diffusion_components import (
    IMAGE_SIDE,
    flow_match_scheduler,
    padded_vocab_size,
    quiet_diffusers,
    seed_everything,
    write_json,
)
from omnistage.testing.diffusion_models import _QWEN_IMAGE_SCHEDULER, NEGATIVE_PROMPT, PROMPT
from omnistage.testing.tokenizers import build_qwen2_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

NAME = "qwen-image-2.1"

# Kwargs for the reference pipeline on `tiny`. 2.1 is sampled without guidance by default
# (true_cfg_scale 1.0); the zoo call turns true CFG on so both branches run.
_CALL_KWARGS = dict(prompt=PROMPT, negative_prompt=NEGATIVE_PROMPT, height=IMAGE_SIDE["tiny"],
                    width=IMAGE_SIDE["tiny"], num_inference_steps=4, true_cfg_scale=2.0)

_DIMS = {
    # head_dim = sum(axes): the RoPE splits it over (frame, height, width).
    "tiny": dict(text_hidden=32, heads=2, head_dim=16, layers=2, axes=(4, 6, 6), vae_base=8),
    "small": dict(text_hidden=64, heads=4, head_dim=32, layers=4, axes=(8, 12, 12), vae_base=16),
}
# Pixels the vision tower sees (min = max): 64x64 is 2x2 merged tokens of 16-pixel patches.
_VISION_PIXELS = {"tiny": 64 * 64, "small": 128 * 128}


def _text_encoder(tokenizer, hidden_size: int):
    """A `Qwen3VLForConditionalGeneration` sized to the tiny tokenizer (special ids inside its vocab)."""
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration(qwen3_vl_config(tokenizer, hidden_size, num_layers=2)).eval()


def qwen3_vl_config(tokenizer, hidden_size: int, num_layers: int):
    """A narrow Qwen3-VL config (a 1-block vision tower) sized to the tiny tokenizer (also Krea 2's
    text encoder)."""
    from transformers import Qwen3VLConfig

    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    num_heads, head_dim = 2, hidden_size // 2
    half = head_dim // 2
    # Interleaved M-RoPE over (time, height, width), like the real [24, 20, 20] for head_dim 128.
    mrope_section = [half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16]
    return Qwen3VLConfig(
        text_config={
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_heads,
            "head_dim": head_dim,
            "vocab_size": padded_vocab_size(tokenizer),
            "max_position_embeddings": 4096,
            "bos_token_id": eos,
            "eos_token_id": eos,
            "pad_token_id": eos,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": mrope_section,
                                "mrope_interleaved": True},
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": hidden_size,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
        },
        tie_word_embeddings=False,
        image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tokenizer.convert_tokens_to_ids("<|vision_end|>"),
    )


def write_qwen3_vl_processor(folder: Path, tokenizer, num_pixels: int) -> None:
    """A Qwen3VLProcessor folder in the Hub layout, written without constructing one."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer.save_pretrained(folder)
    image_config = Qwen2VLImageProcessorPil(
        patch_size=16, size={"shortest_edge": num_pixels, "longest_edge": num_pixels},
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    ).to_dict()
    image_config.update(processor_class="Qwen3VLProcessor", image_processor_type="Qwen2VLImageProcessor")
    write_json(folder / "preprocessor_config.json", image_config)
    video_config = {k: v for k, v in image_config.items() if k != "image_processor_type"}
    video_config["video_processor_type"] = "Qwen3VLVideoProcessor"
    write_json(folder / "video_preprocessor_config.json", video_config)


def build_qwen_image21(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import AutoencoderKLQwenImage21, QwenImage21Pipeline, QwenImage21Transformer2DModel
    from transformers import Qwen3VLProcessor

    from omnistage.models.qwen_image.vl_processor import processor_from_parts

    dims = _DIMS[size]
    seed_everything(seed)
    tokenizer = build_qwen2_tokenizer()
    write_qwen3_vl_processor(out_dir / "processor", tokenizer, _VISION_PIXELS[size])
    text_encoder = _text_encoder(tokenizer, dims["text_hidden"])
    transformer = QwenImage21Transformer2DModel(
        patch_size=1,
        in_channels=64,
        out_channels=64,
        num_layers=dims["layers"],
        attention_head_dim=dims["head_dim"],
        num_attention_heads=dims["heads"],
        context_in_dim=dims["text_hidden"],
        axes_dims_rope=dims["axes"],
    )
    # Four downsamplings: the real 16x. Zero-mean unit-std latents: random weights have no
    # learned latent statistics.
    vae = AutoencoderKLQwenImage21(
        base_dim=dims["vae_base"],
        decoder_base_dim=dims["vae_base"],
        z_dim=64,
        dim_mult=[1, 1, 2, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True, True, False],
        latents_mean=[0.0] * 64,
        latents_std=[1.0] * 64,
    )
    pipe = QwenImage21Pipeline(
        scheduler=flow_match_scheduler(**_QWEN_IMAGE_SCHEDULER),
        vae=vae,
        text_encoder=text_encoder,
        processor=processor_from_parts(Qwen3VLProcessor, str(out_dir)),
        transformer=transformer,
    )
    # The processor folder is already written; saving the partial processor is not wanted.
    pipe.register_modules(processor=None)
    with quiet_diffusers():
        pipe.save_pretrained(out_dir, safe_serialization=True)
    index_path = out_dir / "model_index.json"
    index = json.loads(index_path.read_text())
    index["processor"] = ["transformers", "Qwen3VLProcessor"]
    write_json(index_path, index)


register_zoo_model(
    ZooModel(
        name=NAME,
        kind="diffusion",
        reference_class="diffusers.QwenImage21Pipeline",
        builder=build_qwen_image21,
        sizes=("tiny", "small"),
        description="Qwen-Image 2.1: Qwen3-VL encoder + block-causal single-stream DiT (text prefix KV-cached)",
        call_kwargs=_CALL_KWARGS,
        sides=IMAGE_SIDE,
    )
)
