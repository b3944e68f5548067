"""Stable Diffusion XL (base): text -> image in one diffusion stage. The refiner, diffusers'
optional second stage, is not served yet."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

SDXL = PipelineSpec(
    name="sdxl",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="StableDiffusionXLPipeline"),
    ),
)

register_pipeline("StableDiffusionXLPipeline", SDXL, deploy_config="sdxl.yaml")
register_diffusion_pipeline("StableDiffusionXLPipeline", "omnistage.models.sdxl.pipeline:StableDiffusionXL")
