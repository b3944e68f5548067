"""Ovis-Image (AIDC-AI): text -> image in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

OVIS_IMAGE = PipelineSpec(
    name="ovis_image",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="OvisImagePipeline",
                  # Step mode by default: 0.991x request mode's throughput on the tiny ovis-image, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

register_pipeline("OvisImagePipeline", OVIS_IMAGE, deploy_config="ovis_image.yaml")
register_diffusion_pipeline("OvisImagePipeline", "omnistage.models.ovis_image.pipeline:OvisImage")
