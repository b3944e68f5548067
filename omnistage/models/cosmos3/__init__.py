"""Cosmos3: text -> video, image -> video and video -> video in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline


COSMOS3 = PipelineSpec(
    name="cosmos3",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True,
                  model="Cosmos3OmniPipeline",
                  # Request mode, not measured: it serves one video at a time (deploy max_num_seqs 1).
                  defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("Cosmos3OmniPipeline", COSMOS3, deploy_config="cosmos3.yaml")
register_diffusion_pipeline("Cosmos3OmniPipeline", "omnistage.models.cosmos3.pipeline:Cosmos3")
