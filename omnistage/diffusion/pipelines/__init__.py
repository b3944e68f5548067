"""Native pipelines by diffusers `_class_name`; anything else runs through the generic adapter."""

from __future__ import annotations

import importlib

# diffusers class name -> "module:Class" (imported lazily: each pulls in diffusers).
NATIVE_PIPELINES: dict[str, str] = {
    "ZImagePipeline": "omnistage.diffusion.pipelines.z_image:ZImage",
    "QwenImagePipeline": "omnistage.diffusion.pipelines.qwen_image:QwenImage",
    "QwenImageEditPipeline": "omnistage.diffusion.pipelines.qwen_image_edit:QwenImageEdit",
    "FluxPipeline": "omnistage.diffusion.pipelines.flux:Flux",
    "StableDiffusion3Pipeline": "omnistage.diffusion.pipelines.sd3:StableDiffusion3",
    "WanPipeline": "omnistage.diffusion.pipelines.wan:WanT2V",
    "WanImageToVideoPipeline": "omnistage.diffusion.pipelines.wan:WanI2V",
}


def pipeline_class(class_name: str):
    """The native pipeline class for a diffusers `_class_name`, or the generic adapter."""
    target = NATIVE_PIPELINES.get(class_name, "omnistage.diffusion.pipelines.generic:GenericDiffusersPipeline")
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)
