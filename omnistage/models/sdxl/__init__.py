"""Stable Diffusion XL: the base, text -> image in one diffusion stage; and the base with its
refiner, diffusers' ensemble of experts, as two diffusion stages (`sdxl_refiner`):

    stage 0 "base"    (StableDiffusionXLPipeline): prompt -> latents, denoised to `denoising_end`
    stage 1 "refiner" (StableDiffusionXLImg2ImgPipeline): the base's latents + prompt -> image,
                      denoised from `denoising_start` to the end

Two checkpoints, one pipeline folder whose `config.json` names them by stage
(`omnistage.engine.factory.stage_model_paths`):

    my-sdxl-ensemble/config.json
      {"model_type": "sdxl_refiner",
       "stage_models": {"base": "stabilityai/stable-diffusion-xl-base-1.0",
                        "refiner": "stabilityai/stable-diffusion-xl-refiner-1.0"}}

Its deploy file (sdxl_refiner.yaml) sets where the schedule is split.
"""

from collections.abc import Mapping
from typing import Any

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline
from omnistage.models.diffusion_stages import prompt_of

SDXL = PipelineSpec(
    name="sdxl",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="image", final_output=True,
                  model="StableDiffusionXLPipeline",
                  # Step mode by default: 1.155x request mode's throughput on the tiny sdxl, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)


def base_input(request: Any, upstream: Mapping[int, Any]) -> dict[str, Any]:
    """The prompt, and the base's latents asked for instead of an image."""
    return {"prompt": prompt_of(request), "condition": {"output": "latents"}}


def refiner_input(request: Any, upstream: Mapping[int, Any]) -> dict[str, Any]:
    """The prompt and the base's latents."""
    return {"prompt": prompt_of(request), "condition": {"latents": upstream[0].latents}}


SDXL_REFINER = PipelineSpec(
    name="sdxl_refiner",
    stages=(
        StageSpec(id=0, name="base", kind="diffusion", output="latent", model="StableDiffusionXLPipeline",
                  input_processor=base_input,
                  # Step mode, as the one-stage base (its measured default above).
                  defaults={"step_execution": True}),
        StageSpec(id=1, name="refiner", kind="diffusion", output="image", inputs=(0,), final_output=True,
                  model="StableDiffusionXLImg2ImgPipeline", input_processor=refiner_input,
                  # Request mode: step mode's throughput ratio on the tiny sdxl-refiner is not measured.
                  defaults={"step_execution": False}),
    ),
)

# The refiner checkpoint served alone refines latents a request brings (`{"prompt": ..., "condition":
# {"latents": ...}}` through the Python API), with `denoising_start` in its extras.
SDXL_REFINER_ALONE = PipelineSpec(name="sdxl_refiner_alone", stages=(StageSpec(
    id=0, name="refiner", kind="diffusion", output="image", final_output=True,
    model="StableDiffusionXLImg2ImgPipeline", defaults={"step_execution": False}),))

register_pipeline("StableDiffusionXLPipeline", SDXL, deploy_config="sdxl.yaml")
register_pipeline("StableDiffusionXLImg2ImgPipeline", SDXL_REFINER_ALONE, deploy_config="sdxl.yaml")
register_pipeline("sdxl_refiner", SDXL_REFINER, deploy_config="sdxl_refiner.yaml")
register_diffusion_pipeline("StableDiffusionXLPipeline", "omnistage.models.sdxl.pipeline:StableDiffusionXL")
register_diffusion_pipeline("StableDiffusionXLImg2ImgPipeline",
                            "omnistage.models.sdxl.refiner:StableDiffusionXLRefiner")
