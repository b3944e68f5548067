"""Z-Image (Tongyi-MAI): text -> image in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

Z_IMAGE = PipelineSpec(
    name="z_image",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="ZImagePipeline"),
    ),
)

register_pipeline("ZImagePipeline", Z_IMAGE, deploy_config="z_image.yaml")
register_diffusion_pipeline("ZImagePipeline", "omnistage.models.z_image.pipeline:ZImage")
