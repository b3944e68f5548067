"""Stable Diffusion XL (base): text -> image in one diffusion stage. The refiner, diffusers'
optional second stage, is not served yet."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

SDXL = PipelineSpec(
    name="sdxl",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="StableDiffusionXLPipeline",
                  # Step mode by default: 1.155x request mode's throughput on the tiny sdxl, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

register_pipeline("StableDiffusionXLPipeline", SDXL, deploy_config="sdxl.yaml")
register_diffusion_pipeline("StableDiffusionXLPipeline", "omnistage.models.sdxl.pipeline:StableDiffusionXL")
