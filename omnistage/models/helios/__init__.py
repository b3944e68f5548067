"""Helios: chunk-autoregressive text -> video in one diffusion stage, each chunk streamed as it is made."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline


HELIOS_T2V = PipelineSpec(
    name="helios_t2v",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True,
                  model="HeliosPipeline",
                  # Step mode by default: 1.113x request mode's throughput (by CPU time) on the tiny
                  # helios, at least the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

register_pipeline("HeliosPipeline", HELIOS_T2V, deploy_config="helios.yaml")
register_diffusion_pipeline("HeliosPipeline", "omnistage.models.helios.pipeline:HeliosT2V")
