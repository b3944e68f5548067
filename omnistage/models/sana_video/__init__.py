"""SANA-Video: text -> video and image -> video, each in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline


def _spec(name: str, model: str) -> PipelineSpec:
    return PipelineSpec(
        name=name,
        stages=(
            StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True, model=model,
                      # Step mode by default, not measured (benchmarks/bench_step_mode.py has not run on
                      # it): as the other video families, whose deploy keeps max_num_seqs at 1, where step
                      # mode costs nothing and lets an abort stop within one step.
                      defaults={"step_execution": True},
            ),
        ),
    )


SANA_VIDEO_T2V = _spec("sana_video_t2v", "SanaVideoPipeline")
SANA_VIDEO_I2V = _spec("sana_video_i2v", "SanaImageToVideoPipeline")

register_pipeline("SanaVideoPipeline", SANA_VIDEO_T2V, deploy_config="sana_video.yaml")
register_pipeline("SanaImageToVideoPipeline", SANA_VIDEO_I2V, deploy_config="sana_video.yaml")
register_diffusion_pipeline("SanaVideoPipeline", "omnistage.models.sana_video.pipeline:SanaVideoT2V")
register_diffusion_pipeline("SanaImageToVideoPipeline", "omnistage.models.sana_video.pipeline:SanaVideoI2V")
