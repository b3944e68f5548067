"""LongCat-Image (Meituan): text -> image in one diffusion stage. LongCat-Image-Edit is not
served natively yet."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

LONGCAT_IMAGE = PipelineSpec(
    name="longcat_image",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="LongCatImagePipeline"),
    ),
)

register_pipeline("LongCatImagePipeline", LONGCAT_IMAGE, deploy_config="longcat_image.yaml")
register_diffusion_pipeline("LongCatImagePipeline", "omnistage.models.longcat_image.pipeline:LongCatImage")
