"""Wan 2.x: text -> video, image -> video and VACE (text -> video steered by a control video, its
mask and reference images), each in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

WAN_T2V = PipelineSpec(
    name="wan_t2v",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True, model="WanPipeline",
                  # Request mode by default: step mode made 0.929x its throughput on the tiny wan-t2v,
                  # more than 5% less (benchmarks/RESULTS.md "Step mode vs request mode"; the cause is not profiled).
                  # `step_execution: true` trades that for short requests not waiting behind long ones.
                  defaults={"step_execution": False},
        ),
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
            # Step mode by default: 0.954x request mode's throughput on the tiny wan-i2v, at least
            # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
            defaults={"step_execution": True},
        ),
    ),
)

WAN_VACE = PipelineSpec(
    name="wan_vace",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True, model="WanVACEPipeline",
                  # Step mode by default: 0.973x request mode's throughput on the tiny wan-vace, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode"; a busy machine,
                  # close to the line).
                  defaults={"step_execution": True},
        ),
    ),
)

register_pipeline("WanPipeline", WAN_T2V, deploy_config="wan.yaml")
register_pipeline("WanImageToVideoPipeline", WAN_I2V, deploy_config="wan.yaml")
register_diffusion_pipeline("WanPipeline", "omnistage.models.wan.pipeline:WanT2V")
register_diffusion_pipeline("WanImageToVideoPipeline", "omnistage.models.wan.pipeline:WanI2V")
register_pipeline("WanVACEPipeline", WAN_VACE, deploy_config="wan.yaml")
register_diffusion_pipeline("WanVACEPipeline", "omnistage.models.wan.vace:WanVACE")
