"""FLUX.1 (Black Forest Labs): text -> image in one diffusion stage; FLUX.1-Kontext edits an
input image (or generates from text alone) in one diffusion stage."""

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline

FLUX = PipelineSpec(
    name="flux",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True, model="FluxPipeline",
                  # Step mode by default: 0.962x request mode's throughput on the tiny flux, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

FLUX_KONTEXT = PipelineSpec(
    name="flux_kontext",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="FluxKontextPipeline",
                  # Request mode by default: step mode made 0.726x its throughput on the tiny flux-kontext,
                  # more than 5% less (benchmarks/RESULTS.md "Step mode vs request mode"; the cause is not profiled).
                  # `step_execution: true` trades that for short requests not waiting behind long ones.
                  defaults={"step_execution": False},
        ),
    ),
)

register_pipeline("FluxPipeline", FLUX, deploy_config="flux.yaml")
register_pipeline("FluxKontextPipeline", FLUX_KONTEXT, deploy_config="flux_kontext.yaml")
register_diffusion_pipeline("FluxPipeline", "omnistage.models.flux.pipeline:Flux")
register_diffusion_pipeline("FluxKontextPipeline", "omnistage.models.flux.kontext_pipeline:FluxKontext")
