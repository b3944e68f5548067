"""Zoo builder for Qwen-Image-Layered (QwenImageLayeredPipeline): an RGBA image decomposed into
RGBA layers.

Qwen-Image's components with three changes the checkpoint makes: the VAE reads and writes RGBA
(`input_channels=4`), the transformer takes an extra timestep condition (`use_additional_t_cond`)
and rotates positions per layer (`use_layer3d_rope`). The `processor/` folder (used only to
caption an image when the prompt is empty, which omnistage does not run) is written from its
parts, as Qwen-Image-Edit's is, because transformers cannot build a Qwen2VLProcessor without
torchvision.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import IMAGE_SIDE, seed_everything
from omnistage.testing.diffusion_models import (
    _QWEN_EDIT_VISION_PIXELS,
    _QWEN_IMAGE,
    _QWEN_IMAGE_VAE,
    NEGATIVE_PROMPT,
    _qwen_image_components,
    save_qwen_edit_pipeline,
)
from omnistage.testing.zoo import ZooModel, register_zoo_model

NAME = "qwen-image-layered"

# Kwargs for the reference pipeline on `tiny`; it also needs image= (RGBA). diffusers takes no
# output size: it generates `resolution`**2 pixels (640 or 1024) at the image's aspect ratio.
_CALL_KWARGS = dict(prompt="a red ball in front of a blue wall", negative_prompt=NEGATIVE_PROMPT, layers=2,
                    num_inference_steps=4, true_cfg_scale=2.0)


def build_qwen_image_layered(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import QwenImageLayeredPipeline

    seed_everything(seed)
    components = _qwen_image_components(dict(_QWEN_IMAGE[size], **_QWEN_IMAGE_VAE[size]), vision_depth=1,
                                        image_channels=4, use_additional_t_cond=True, use_layer3d_rope=True)
    save_qwen_edit_pipeline(QwenImageLayeredPipeline(**components, processor=None), out_dir, components["tokenizer"],
                            _QWEN_EDIT_VISION_PIXELS[size])


register_zoo_model(
    ZooModel(
        name=NAME,
        kind="diffusion",
        reference_class="diffusers.QwenImageLayeredPipeline",
        builder=build_qwen_image_layered,
        sizes=("tiny", "small"),
        description="Qwen-Image-Layered: an RGBA image decomposed into RGBA layers (RGBA VAE, layer-3D RoPE)",
        call_kwargs=_CALL_KWARGS,
        sides=IMAGE_SIDE,
    )
)
