"""ERNIE-Image (Baidu): text -> image in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

ERNIE_IMAGE = PipelineSpec(
    name="ernie_image",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="ErnieImagePipeline",
                  # Request mode by default: step mode made 0.801x its throughput on the tiny ernie-image,
                  # more than 5% less (benchmarks/RESULTS.md "Step mode vs request mode"; the cause is not profiled).
                  # `step_execution: true` trades that for short requests not waiting behind long ones.
                  defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("ErnieImagePipeline", ERNIE_IMAGE, deploy_config="ernie_image.yaml")
register_diffusion_pipeline("ErnieImagePipeline", "omnistage.models.ernie_image.pipeline:ErnieImage")
