"""LongCat-Image zoo builders: `LongCatImagePipeline` (a Qwen2.5-VL text encoder read at its
last layer over a fixed 512-token prompt block, a FLUX-style MMDiT, FLUX.1's VAE) and
`LongCatImageEditPipeline`, the same components saved as an edit pipeline.

Their `text_processor` (a Qwen2VLProcessor: the text-to-image pipeline uses it only to rewrite
prompts with the VLM, which omnistage does not run; the edit pipeline's image processor
prepares the input image for the vision tower) cannot be constructed without torchvision in transformers 5.24: the
folder is written in the Hub layout from its parts, as the Qwen-Image-Edit zoo model's is.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnistage.testing.diffusion_components import (
    IMAGE_SIDE,
    autoencoder_kl,
    flow_match_scheduler,
    qwen2_5_vl_text_encoder,
    quiet_diffusers,
    save_pipeline,
    seed_everything,
    write_json,
)
from omnistage.testing.diffusion_models import NEGATIVE_PROMPT, write_qwen2_vl_processor
from omnistage.testing.tokenizers import build_qwen2_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")

_LONGCAT = {
    "tiny": dict(text_hidden=16, heads=2, head_dim=16, layers=1, single_layers=1, axes=(4, 6, 6)),
    "small": dict(text_hidden=32, heads=4, head_dim=32, layers=2, single_layers=4, axes=(8, 12, 12)),
}

# FLUX.1-dev's scheduler settings (LongCat-Image's pipeline shifts its sigmas the same way).
_LONGCAT_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                          max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)


def longcat_components(size: str) -> dict:
    """The tiny or small LongCat-Image components (without the text_processor, written apart):
    the text-to-image and edit checkpoints share them."""
    from diffusers import LongCatImageTransformer2DModel

    dims = _LONGCAT[size]
    tokenizer = build_qwen2_tokenizer()
    transformer = LongCatImageTransformer2DModel(
        patch_size=1,
        in_channels=64,  # 16 latent channels packed 2x2
        num_layers=dims["layers"],
        num_single_layers=dims["single_layers"],
        attention_head_dim=dims["head_dim"],
        num_attention_heads=dims["heads"],
        joint_attention_dim=dims["text_hidden"],
        pooled_projection_dim=dims["text_hidden"],
        axes_dims_rope=list(dims["axes"]),
    )
    return dict(
        scheduler=flow_match_scheduler(**_LONGCAT_SCHEDULER),
        vae=autoencoder_kl(size, scaling_factor=0.3611, shift_factor=0.1159),
        text_encoder=qwen2_5_vl_text_encoder(tokenizer, hidden_size=dims["text_hidden"], num_layers=2,
                                             vision_depth=1),
        tokenizer=tokenizer,
        transformer=transformer,
    )


def build_longcat(pipeline_class: type, out_dir: Path, size: str, seed: int) -> None:
    """Save a LongCat pipeline of `pipeline_class` (text-to-image or edit) with its text_processor
    folder written from parts; the edit pipeline's __init__ needs the processor object itself."""
    from transformers import Qwen2VLProcessor

    from omnistage.models.qwen_image.vl_processor import processor_from_parts

    seed_everything(seed)
    components = longcat_components(size)
    write_qwen2_vl_processor(out_dir / "text_processor", components["tokenizer"], 56 * 56)
    pipe = pipeline_class(**components,
                          text_processor=processor_from_parts(Qwen2VLProcessor, str(out_dir), "text_processor"))
    pipe.register_modules(text_processor=None)  # its folder is written; the partial processor is not saved
    with quiet_diffusers():  # it warns that the text_processor=None cannot be saved
        save_pipeline(pipe, out_dir)
    index_path = out_dir / "model_index.json"
    index = json.loads(index_path.read_text())
    index["text_processor"] = ["transformers", "Qwen2VLProcessor"]
    write_json(index_path, index)


def build_longcat_image(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import LongCatImagePipeline

    build_longcat(LongCatImagePipeline, out_dir, size, seed)


# `enable_prompt_rewrite=False`: diffusers' default rewrites the prompt with the VLM, which
# omnistage does not run (our pipeline accepts the field only as false).
_CALL_KWARGS = dict(prompt='a sign that reads "OPEN" on a red door', negative_prompt=NEGATIVE_PROMPT,
                    height=IMAGE_SIDE["tiny"], width=IMAGE_SIDE["tiny"], num_inference_steps=4, guidance_scale=4.5,
                    enable_prompt_rewrite=False)

register_zoo_model(ZooModel(name="longcat-image", kind="diffusion", reference_class="diffusers.LongCatImagePipeline",
                            builder=build_longcat_image, sizes=SIZES, call_kwargs=_CALL_KWARGS, sides=IMAGE_SIDE,
                            description="LongCat-Image: Qwen2.5-VL text encoder, FLUX-style MMDiT, FLUX.1 VAE"))


def build_longcat_image_edit(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import LongCatImageEditPipeline

    build_longcat(LongCatImageEditPipeline, out_dir, size, seed)


# Also needs image=: diffusion_models.default_input_image() gives one. diffusers takes no output
# size: it generates about a megapixel at the input image's aspect ratio, so even `tiny` denoises
# 4096 latent tokens next to the input image's 4096.
_EDIT_CALL_KWARGS = dict(prompt='change the sign to read "CLOSED"', negative_prompt=NEGATIVE_PROMPT,
                         num_inference_steps=4, guidance_scale=4.5)

register_zoo_model(ZooModel(name="longcat-image-edit", kind="diffusion",
                            reference_class="diffusers.LongCatImageEditPipeline", builder=build_longcat_image_edit,
                            sizes=SIZES, call_kwargs=_EDIT_CALL_KWARGS, sides=IMAGE_SIDE,
                            description="LongCat-Image-Edit: LongCat-Image editing an input image read by the "
                                        "Qwen2.5-VL encoder and as extra latent tokens"))
