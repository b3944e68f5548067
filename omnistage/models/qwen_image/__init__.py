"""Qwen-Image: text -> image, and Qwen-Image-Edit: image + instruction -> image.

Each is one diffusion stage; the edit variant takes the input image through the
request, not through an upstream stage.
"""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

QWEN_IMAGE = PipelineSpec(
    name="qwen_image",
    stages=(
        StageSpec(
            id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="QwenImagePipeline"
        ),
    ),
)

QWEN_IMAGE_EDIT = PipelineSpec(
    name="qwen_image_edit",
    stages=(
        StageSpec(
            id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="QwenImageEditPipeline"
        ),
    ),
)

register_pipeline("QwenImagePipeline", QWEN_IMAGE, deploy_config="qwen_image.yaml")
register_pipeline("QwenImageEditPipeline", QWEN_IMAGE_EDIT, deploy_config="qwen_image_edit.yaml")
register_diffusion_pipeline("QwenImagePipeline", "omnistage.models.qwen_image.pipeline:QwenImage")
register_diffusion_pipeline("QwenImageEditPipeline", "omnistage.models.qwen_image.edit_pipeline:QwenImageEdit")
