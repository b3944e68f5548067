"""Krea 2: text -> image in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

KREA2 = PipelineSpec(
    name="krea2",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="Krea2Pipeline",
                  # Request mode by default: step mode made 0.796x its throughput on the tiny krea2,
                  # more than 5% less (benchmarks/RESULTS.md "Step mode vs request mode"; the cause is not profiled).
                  # `step_execution: true` trades that for short requests not waiting behind long ones.
                  defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("Krea2Pipeline", KREA2, deploy_config="krea2.yaml")
register_diffusion_pipeline("Krea2Pipeline", "omnistage.models.krea2.pipeline:Krea2")
