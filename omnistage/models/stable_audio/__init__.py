"""Stable Audio (Stability AI): text -> audio in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

STABLE_AUDIO = PipelineSpec(
    name="stable_audio",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="audio", final_output=True,
                  model="StableAudioPipeline"),
    ),
)

register_pipeline("StableAudioPipeline", STABLE_AUDIO, deploy_config="stable_audio.yaml")
register_diffusion_pipeline("StableAudioPipeline", "omnistage.models.stable_audio.pipeline:StableAudio")
