"""LongCat-Image (Meituan): text -> image in one diffusion stage; LongCat-Image-Edit: an input
image and an instruction -> image in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

LONGCAT_IMAGE = PipelineSpec(
    name="longcat_image",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="LongCatImagePipeline",
                  # Step mode by default: 0.983x request mode's throughput on the tiny longcat-image, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

LONGCAT_IMAGE_EDIT = PipelineSpec(
    name="longcat_image_edit",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="LongCatImageEditPipeline",
                  # Step mode by default: 1.037x request mode's throughput on the tiny longcat-image-edit at
                  # 64x64 (benchmarks/bench_step_mode.py --models longcat-image-edit --no-write, one run on a
                  # shared machine; not yet in RESULTS.md).
                  defaults={"step_execution": True},
        ),
    ),
)

register_pipeline("LongCatImagePipeline", LONGCAT_IMAGE, deploy_config="longcat_image.yaml")
register_pipeline("LongCatImageEditPipeline", LONGCAT_IMAGE_EDIT, deploy_config="longcat_image_edit.yaml")
register_diffusion_pipeline("LongCatImagePipeline", "omnistage.models.longcat_image.pipeline:LongCatImage")
register_diffusion_pipeline("LongCatImageEditPipeline",
                            "omnistage.models.longcat_image.edit_pipeline:LongCatImageEdit")
