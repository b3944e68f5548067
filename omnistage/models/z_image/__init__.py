"""Z-Image (Tongyi-MAI): text -> image in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

Z_IMAGE = PipelineSpec(
    name="z_image",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="ZImagePipeline",
                  # Request mode by default: step mode made 0.887x its throughput on the tiny z-image,
                  # more than 5% less (benchmarks/RESULTS.md "Step mode vs request mode"; the cause is not profiled).
                  # `step_execution: true` trades that for short requests not waiting behind long ones.
                  defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("ZImagePipeline", Z_IMAGE, deploy_config="z_image.yaml")
register_diffusion_pipeline("ZImagePipeline", "omnistage.models.z_image.pipeline:ZImage")
