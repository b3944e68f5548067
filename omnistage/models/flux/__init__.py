"""FLUX.1 (Black Forest Labs): text -> image in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

FLUX = PipelineSpec(
    name="flux",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="FluxPipeline"),
    ),
)

register_pipeline("FluxPipeline", FLUX, deploy_config="flux.yaml")
register_diffusion_pipeline("FluxPipeline", "omnistage.models.flux.pipeline:Flux")
