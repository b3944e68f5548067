"""FLUX.2 (Black Forest Labs), dev and klein: text (+ optional reference images) -> image in
one diffusion stage. The reference images come with the request, not from an upstream stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

FLUX2 = PipelineSpec(
    name="flux2",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="Flux2Pipeline",
                  # Step mode by default: 0.996x request mode's throughput on the tiny flux2, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

FLUX2_KLEIN = PipelineSpec(
    name="flux2_klein",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="Flux2KleinPipeline",
                  # Step mode by default: 1.439x request mode's throughput on the tiny flux2-klein, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

register_pipeline("Flux2Pipeline", FLUX2, deploy_config="flux2.yaml")
register_pipeline("Flux2KleinPipeline", FLUX2_KLEIN, deploy_config="flux2.yaml")
register_diffusion_pipeline("Flux2Pipeline", "omnistage.models.flux2.pipeline:Flux2")
register_diffusion_pipeline("Flux2KleinPipeline", "omnistage.models.flux2.klein_pipeline:Flux2Klein")
