"""HunyuanVideo-1.5: text -> video and image -> video, each in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

HUNYUAN_VIDEO_T2V = PipelineSpec(
    name="hunyuan_video_t2v",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True,
                  model="HunyuanVideo15Pipeline",
                  # Step mode by default: 0.993x request mode's throughput on the tiny hunyuan-video, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

HUNYUAN_VIDEO_I2V = PipelineSpec(
    name="hunyuan_video_i2v",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True,
                  model="HunyuanVideo15ImageToVideoPipeline",
                  # Step mode by default: 1.074x request mode's throughput on the tiny hunyuan-video-i2v, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

register_pipeline("HunyuanVideo15Pipeline", HUNYUAN_VIDEO_T2V, deploy_config="hunyuan_video.yaml")
register_diffusion_pipeline("HunyuanVideo15Pipeline", "omnistage.models.hunyuan_video.pipeline:HunyuanVideo15T2V")
register_pipeline("HunyuanVideo15ImageToVideoPipeline", HUNYUAN_VIDEO_I2V, deploy_config="hunyuan_video.yaml")
register_diffusion_pipeline("HunyuanVideo15ImageToVideoPipeline",
                            "omnistage.models.hunyuan_video.pipeline:HunyuanVideo15I2V")
