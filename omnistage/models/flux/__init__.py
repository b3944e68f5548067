"""FLUX.1 (Black Forest Labs): text -> image in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

FLUX = PipelineSpec(
    name="flux",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="FluxPipeline",
                  # Step mode by default: 0.962x request mode's throughput on the tiny flux, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

register_pipeline("FluxPipeline", FLUX, deploy_config="flux.yaml")
register_diffusion_pipeline("FluxPipeline", "omnistage.models.flux.pipeline:Flux")
