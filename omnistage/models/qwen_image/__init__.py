"""Qwen-Image: text -> image, Qwen-Image-Edit: image + instruction -> image,
Qwen-Image-Edit-Plus: 1-3 images + instruction -> image, and Qwen-Image 2.1: text -> image.

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

QWEN_IMAGE_EDIT_PLUS = PipelineSpec(
    name="qwen_image_edit_plus",
    stages=(
        StageSpec(
            id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
            model="QwenImageEditPlusPipeline",
        ),
    ),
)

QWEN_IMAGE_21 = PipelineSpec(
    name="qwen_image_21",
    stages=(
        StageSpec(
            id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="QwenImage21Pipeline"
        ),
    ),
)

register_pipeline("QwenImagePipeline", QWEN_IMAGE, deploy_config="qwen_image.yaml")
register_pipeline("QwenImageEditPipeline", QWEN_IMAGE_EDIT, deploy_config="qwen_image_edit.yaml")
register_pipeline("QwenImageEditPlusPipeline", QWEN_IMAGE_EDIT_PLUS, deploy_config="qwen_image_edit_plus.yaml")
register_pipeline("QwenImage21Pipeline", QWEN_IMAGE_21, deploy_config="qwen_image_21.yaml")
register_diffusion_pipeline("QwenImagePipeline", "omnistage.models.qwen_image.pipeline:QwenImage")
register_diffusion_pipeline("QwenImageEditPipeline", "omnistage.models.qwen_image.edit_pipeline:QwenImageEdit")
register_diffusion_pipeline("QwenImageEditPlusPipeline",
                            "omnistage.models.qwen_image.edit_plus_pipeline:QwenImageEditPlus")
register_diffusion_pipeline("QwenImage21Pipeline", "omnistage.models.qwen_image.v21_pipeline:QwenImage21")
