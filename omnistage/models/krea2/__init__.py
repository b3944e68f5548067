"""Krea 2: text -> image in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

KREA2 = PipelineSpec(
    name="krea2",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="Krea2Pipeline"),
    ),
)

register_pipeline("Krea2Pipeline", KREA2, deploy_config="krea2.yaml")
register_diffusion_pipeline("Krea2Pipeline", "omnistage.models.krea2.pipeline:Krea2")
