"""Zoo builder for Qwen-Image-Edit-Plus (QwenImageEditPlusPipeline, as Qwen-Image-Edit-2509).

The checkpoint is Qwen-Image-Edit's in every component (Qwen2.5-VL text encoder with its
vision tower, MMDiT, causal-3D VAE, the `processor/` folder written from its parts because
transformers cannot build a Qwen2VLProcessor without torchvision): only model_index.json's
class differs, so the builder reuses the edit model's (diffusion_models.py; see the notes
there on why the VAE downsamples 16x and keeps its encoder narrow). Like the edit model, the
pipeline VAE-encodes every input image at about 1024x1024 whatever the output size, so a
tiny edit from three images costs about three tiny single-image edits.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import IMAGE_SIDE, seed_everything
from omnistage.testing.diffusion_models import (
    _QWEN_EDIT_VAE,
    _QWEN_EDIT_VISION_PIXELS,
    _QWEN_IMAGE,
    NEGATIVE_PROMPT,
    PROMPT,
    _qwen_image_components,
    save_qwen_edit_pipeline,
)
from omnistage.testing.zoo import ZooModel, register_zoo_model

NAME = "qwen-image-edit-plus"

# Kwargs for the reference pipeline on `tiny`; it also needs image= (1-3 images).
_CALL_KWARGS = dict(prompt=PROMPT, negative_prompt=NEGATIVE_PROMPT, height=IMAGE_SIDE["tiny"],
                    width=IMAGE_SIDE["tiny"], num_inference_steps=4, true_cfg_scale=2.0)


def build_qwen_image_edit_plus(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import QwenImageEditPlusPipeline

    seed_everything(seed)
    components = _qwen_image_components(dict(_QWEN_IMAGE[size], **_QWEN_EDIT_VAE[size]), vision_depth=2)
    save_qwen_edit_pipeline(QwenImageEditPlusPipeline(**components, processor=None), out_dir, components["tokenizer"],
                            _QWEN_EDIT_VISION_PIXELS[size])


register_zoo_model(
    ZooModel(
        name=NAME,
        kind="diffusion",
        reference_class="diffusers.QwenImageEditPlusPipeline",
        builder=build_qwen_image_edit_plus,
        sizes=("tiny", "small"),
        description="Qwen-Image-Edit-Plus (2509): Qwen-Image-Edit from 1-3 input images",
        call_kwargs=_CALL_KWARGS,
        sides=IMAGE_SIDE,
    )
)
