"""LongCat-Image (Meituan): text -> image in one diffusion stage. LongCat-Image-Edit is not
served natively yet."""

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

register_pipeline("LongCatImagePipeline", LONGCAT_IMAGE, deploy_config="longcat_image.yaml")
register_diffusion_pipeline("LongCatImagePipeline", "omnistage.models.longcat_image.pipeline:LongCatImage")
