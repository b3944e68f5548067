"""LTX-2: text or image -> video with its soundtrack, in one diffusion stage (the MP4 carries the audio);
and its two-stage pipeline (`ltx2_two_stage`), diffusers' recipe of three chained calls as three stages:

    stage 0 "base"      (LTX2Pipeline): prompt -> video and audio latents at the asked size
    stage 1 "upsampler" (LTX2LatentUpsamplePipeline): the video latents -> twice the size
    stage 2 "refiner"   (LTX2Pipeline): the upsampled video latents and the audio latents, noised
                        to the distilled stage-2 schedule's first sigma, refined in its 3 steps -> video

The output is the upsampler's scale (2x) times the asked size. The refiner draws its noise on from
the base's generator (one generator through the chain, as in diffusers' example). Three
checkpoints, one pipeline folder whose `config.json` names them by stage
(`omnistage.engine.factory.stage_model_paths`):

    my-ltx2-two-stage/config.json
      {"model_type": "ltx2_two_stage",
       "stage_models": {"base": "Lightricks/LTX-2", "upsampler": "<an LTX2LatentUpsamplePipeline folder>",
                        "refiner": "Lightricks/LTX-2"}}

Its deploy file (ltx2_two_stage.yaml) sets the refiner's schedule; a distilled checkpoint runs its
base with `schedule: distilled` and no CFG, a dev one refines with the distilled LoRA (`lora`).
"""

from collections.abc import Mapping
from typing import Any

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline
from omnistage.models.diffusion_stages import prompt_of

LTX2_T2V = PipelineSpec(
    name="ltx2_t2v",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True, model="LTX2Pipeline",
                  # Step mode by default: 1.000x request mode's throughput on the tiny ltx2, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ),
)

LTX2_I2V = PipelineSpec(
    name="ltx2_i2v",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True,
                  model="LTX2ImageToVideoPipeline",
                  # Request mode: ltx2.yaml serves one video at a time (max_num_seqs 1), so there is no
                  # batch for step mode to join; the same passes as LTX2Pipeline's, one image encode more.
                  defaults={"step_execution": False},
        ),
    ),
)

LTX2_CONDITION = PipelineSpec(
    name="ltx2_condition",
    stages=(
        StageSpec(id=0, name="diffusion", kind="diffusion", output="video", final_output=True,
                  model="LTX2ConditionPipeline",
                  # Request mode: ltx2.yaml serves one video at a time (max_num_seqs 1), so there is no
                  # batch for step mode to join; not measured.
                  defaults={"step_execution": False},
        ),
    ),
)


def base_input(request: Any, upstream: Mapping[int, Any]) -> dict[str, Any]:
    """The prompt, and the base's latents asked for instead of a video."""
    return {"prompt": prompt_of(request), "condition": {"output": "latents"}}


def upsampler_input(request: Any, upstream: Mapping[int, Any]) -> dict[str, Any]:
    """The base's video latents to upsample; its audio latents and generator ride along."""
    base = upstream[0]
    return {"prompt": prompt_of(request), "condition": {"latents": base.latents, **base.extras, "output": "latents"}}


def refiner_input(request: Any, upstream: Mapping[int, Any]) -> dict[str, Any]:
    """The prompt, the upsampled video latents, the base's audio latents and generator."""
    upsampled = upstream[1]
    return {"prompt": prompt_of(request), "condition": {"latents": upsampled.latents, **upsampled.extras}}


LTX2_TWO_STAGE = PipelineSpec(
    name="ltx2_two_stage",
    stages=(
        StageSpec(id=0, name="base", kind="diffusion", output="latent", model="LTX2Pipeline",
                  input_processor=base_input,
                  # Step mode, as the one-stage LTX2Pipeline (its measured default above).
                  defaults={"step_execution": True}),
        StageSpec(id=1, name="upsampler", kind="diffusion", output="latent", inputs=(0,),
                  model="LTX2LatentUpsamplePipeline", input_processor=upsampler_input,
                  # Request mode: one pass per request, there are no steps to join between.
                  defaults={"step_execution": False}),
        StageSpec(id=2, name="refiner", kind="diffusion", output="video", inputs=(1,), final_output=True,
                  model="LTX2Pipeline", input_processor=refiner_input,
                  # Request mode: step mode's throughput ratio on the refiner is not measured.
                  defaults={"step_execution": False}),
    ),
)

# The upsampler served alone takes latents a request brings (`{"prompt": ..., "condition": {"latents":
# ...}}` through the Python API) and decodes the upsampled ones, as LTX2LatentUpsamplePipeline(latents=...).
LTX2_LATENT_UPSAMPLE = PipelineSpec(name="ltx2_latent_upsample", stages=(StageSpec(
    id=0, name="upsampler", kind="diffusion", output="video", final_output=True,
    model="LTX2LatentUpsamplePipeline", defaults={"step_execution": False}),))

register_pipeline("LTX2Pipeline", LTX2_T2V, deploy_config="ltx2.yaml")
register_pipeline("LTX2ImageToVideoPipeline", LTX2_I2V, deploy_config="ltx2.yaml")
register_pipeline("LTX2ConditionPipeline", LTX2_CONDITION, deploy_config="ltx2.yaml")
register_diffusion_pipeline("LTX2Pipeline", "omnistage.models.ltx2.pipeline:LTX2T2V")
register_diffusion_pipeline("LTX2ImageToVideoPipeline", "omnistage.models.ltx2.pipeline:LTX2I2V")
register_diffusion_pipeline("LTX2ConditionPipeline", "omnistage.models.ltx2.pipeline:LTX2Condition")
register_pipeline("ltx2_two_stage", LTX2_TWO_STAGE, deploy_config="ltx2_two_stage.yaml")
register_pipeline("LTX2LatentUpsamplePipeline", LTX2_LATENT_UPSAMPLE, deploy_config="ltx2.yaml")
register_diffusion_pipeline("LTX2LatentUpsamplePipeline", "omnistage.models.ltx2.upsample:LTX2LatentUpsample")
