"""Stable Audio (Stability AI): text -> audio in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

STABLE_AUDIO = PipelineSpec(
    name="stable_audio",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="audio", final_output=True,
                  model="StableAudioPipeline",
                  # Request mode by default: step mode made 0.896x its throughput on the tiny stable-audio,
                  # more than 5% less (benchmarks/RESULTS.md "Step mode vs request mode"; the cause is not profiled).
                  # `step_execution: true` trades that for short requests not waiting behind long ones.
                  defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("StableAudioPipeline", STABLE_AUDIO, deploy_config="stable_audio.yaml")
register_diffusion_pipeline("StableAudioPipeline", "omnistage.models.stable_audio.pipeline:StableAudio")
