"""Helios: chunk-autoregressive text -> video in one diffusion stage, each chunk streamed as it is made."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline


HELIOS_T2V = PipelineSpec(
    name="helios_t2v",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True,
                  model="HeliosPipeline",
                  # Step mode by default, so a streamed session's chunks leave as each is made while
                  # other requests join between steps.
                  defaults={"step_execution": True},
        ),
    ),
)

register_pipeline("HeliosPipeline", HELIOS_T2V, deploy_config="helios.yaml")
register_diffusion_pipeline("HeliosPipeline", "omnistage.models.helios.pipeline:HeliosT2V")
