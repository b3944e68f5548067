"""Stable Diffusion 3 / 3.5: text -> image in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

SD3 = PipelineSpec(
    name="sd3",
    stages=(
        StageSpec(
            id=0,
            name="diffusion",
            kind="diffusion",
            output="image",
            final_output=True,
            model="StableDiffusion3Pipeline",
            # Request mode by default: step mode made 0.796x its throughput on the tiny sd3,
            # more than 5% less (benchmarks/RESULTS.md "Step mode vs request mode"; the cause is not profiled).
            # `step_execution: true` trades that for short requests not waiting behind long ones.
            defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("StableDiffusion3Pipeline", SD3, deploy_config="sd3.yaml")
register_diffusion_pipeline("StableDiffusion3Pipeline", "omnistage.models.sd3.pipeline:StableDiffusion3")
