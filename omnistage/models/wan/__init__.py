"""Wan 2.x: text -> video and image -> video, each in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

WAN_T2V = PipelineSpec(
    name="wan_t2v",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True, model="WanPipeline"),
    ),
)

WAN_I2V = PipelineSpec(
    name="wan_i2v",
    stages=(
        StageSpec(
            id=0,
            name="diffusion",
            kind="diffusion",
            output="video",
            final_output=True,
            model="WanImageToVideoPipeline",
        ),
    ),
)

register_pipeline("WanPipeline", WAN_T2V, deploy_config="wan.yaml")
register_pipeline("WanImageToVideoPipeline", WAN_I2V, deploy_config="wan.yaml")
register_diffusion_pipeline("WanPipeline", "omnistage.models.wan.pipeline:WanT2V")
register_diffusion_pipeline("WanImageToVideoPipeline", "omnistage.models.wan.pipeline:WanI2V")
