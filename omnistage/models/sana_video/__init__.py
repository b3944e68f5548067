"""SANA-Video: text -> video and image -> video, each in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline


SANA_VIDEO_T2V = PipelineSpec(
    name="sana_video_t2v",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True,
                  model="SanaVideoPipeline",
                  # Step mode by default: 1.030x request mode's throughput on the tiny sana-video, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

SANA_VIDEO_I2V = PipelineSpec(
    name="sana_video_i2v",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True,
                  model="SanaImageToVideoPipeline",
                  # Step mode by default: 1.063x request mode's throughput on the tiny sana-video-i2v, at
                  # least the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

register_pipeline("SanaVideoPipeline", SANA_VIDEO_T2V, deploy_config="sana_video.yaml")
register_pipeline("SanaImageToVideoPipeline", SANA_VIDEO_I2V, deploy_config="sana_video.yaml")
register_diffusion_pipeline("SanaVideoPipeline", "omnistage.models.sana_video.pipeline:SanaVideoT2V")
register_diffusion_pipeline("SanaImageToVideoPipeline", "omnistage.models.sana_video.pipeline:SanaVideoI2V")
