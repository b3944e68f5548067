"""Qwen-Image: text -> image, Qwen-Image-Edit: image + instruction -> image,
Qwen-Image-Edit-Plus: 1-3 images + instruction -> image, Qwen-Image-Layered: an RGBA image +
its caption -> its RGBA layers, and Qwen-Image 2.1: text -> image.

Each is one diffusion stage; the edit variant takes the input image through the
request, not through an upstream stage.
"""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

QWEN_IMAGE = PipelineSpec(
    name="qwen_image",
    stages=(
        StageSpec(
            id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="QwenImagePipeline",
            # Request mode by default: step mode made 0.929x its throughput on the tiny qwen-image,
            # more than 5% less (benchmarks/RESULTS.md "Step mode vs request mode"; the cause is not profiled).
            # `step_execution: true` trades that for short requests not waiting behind long ones.
            defaults={"step_execution": False},
        ),
    ),
)

QWEN_IMAGE_EDIT = PipelineSpec(
    name="qwen_image_edit",
    stages=(
        StageSpec(
            id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="QwenImageEditPipeline",
            # Step mode by default: 0.971x request mode's throughput on the tiny qwen-image-edit, at least
            # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
            defaults={"step_execution": True},
        ),
    ),
)

QWEN_IMAGE_EDIT_PLUS = PipelineSpec(
    name="qwen_image_edit_plus",
    stages=(
        StageSpec(
            id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
            model="QwenImageEditPlusPipeline",
            # Step mode by default: 0.994x request mode's throughput on the tiny qwen-image-edit-plus, at least
            # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
            defaults={"step_execution": True},
        ),
    ),
)

QWEN_IMAGE_LAYERED = PipelineSpec(
    name="qwen_image_layered",
    stages=(
        StageSpec(
            id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
            model="QwenImageLayeredPipeline",
            # Step mode by default: 0.988x request mode's throughput on the tiny qwen-image-layered at
            # 64x64 (benchmarks/bench_step_mode.py --models qwen-image-layered --no-write, one run on a
            # shared machine; not yet in RESULTS.md).
            defaults={"step_execution": True},
        ),
    ),
)

QWEN_IMAGE_21 = PipelineSpec(
    name="qwen_image_21",
    stages=(
        StageSpec(
            id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="QwenImage21Pipeline",
            # Request mode by default: step mode made 0.794x its throughput on the tiny qwen-image-2.1,
            # more than 5% less (benchmarks/RESULTS.md "Step mode vs request mode"; the cause is not profiled).
            # `step_execution: true` trades that for short requests not waiting behind long ones.
            defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("QwenImagePipeline", QWEN_IMAGE, deploy_config="qwen_image.yaml")
register_pipeline("QwenImageEditPipeline", QWEN_IMAGE_EDIT, deploy_config="qwen_image_edit.yaml")
register_pipeline("QwenImageEditPlusPipeline", QWEN_IMAGE_EDIT_PLUS, deploy_config="qwen_image_edit_plus.yaml")
register_pipeline("QwenImageLayeredPipeline", QWEN_IMAGE_LAYERED, deploy_config="qwen_image_layered.yaml")
register_pipeline("QwenImage21Pipeline", QWEN_IMAGE_21, deploy_config="qwen_image_21.yaml")
register_diffusion_pipeline("QwenImagePipeline", "omnistage.models.qwen_image.pipeline:QwenImage")
register_diffusion_pipeline("QwenImageEditPipeline", "omnistage.models.qwen_image.edit_pipeline:QwenImageEdit")
register_diffusion_pipeline("QwenImageEditPlusPipeline",
                            "omnistage.models.qwen_image.edit_plus_pipeline:QwenImageEditPlus")
register_diffusion_pipeline("QwenImageLayeredPipeline", "omnistage.models.qwen_image.layered_pipeline:QwenImageLayered")
register_diffusion_pipeline("QwenImage21Pipeline", "omnistage.models.qwen_image.v21_pipeline:QwenImage21")
