"""GLM-Image (zai-org): an AR prior writes image tokens, a DiT draws them. Two stages:

    stage 0 "prior" (ar, tokens): prompt + target size -> a preview grid and the target
                                  grid of image codes (transformers GlmImageForConditionalGeneration)
    stage 1 "dit"   (diffusion, image, final): the target grid, upsampled, + the T5 glyph
                                  embeddings of the prompt's quoted text -> the image

Both load the one diffusers folder (model_index.json `_class_name` GlmImagePipeline): the
prior its `vision_language_encoder/` and `processor/`, the DiT the rest. The prior samples
with the checkpoint's generation_config.json rules (what `generate(do_sample=True)` in
diffusers' pipeline applies), seeded with the image's seed: with the same seed a request
gives `GlmImagePipeline`'s image.
"""

from __future__ import annotations

from omnistage.ar.model import register_ar_model
from omnistage.config import ModelFiles, PipelineDeployConfig, PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.registry import register_diffusion_pipeline
from omnistage.models.glm_image.processors import DIT, PRIOR, dit_stage_inputs, prior_inputs

# transformers' GenerationConfig defaults for what the checkpoint's file leaves out.
_GENERATE_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}


def prior_sampling(files: ModelFiles) -> dict:
    """The prior's sampling rules: `generate(do_sample=True)` with vision_language_encoder/generation_config.json."""
    config = files.read_json("vision_language_encoder/generation_config.json") or {}
    rules = {k: config.get(k, v) if config.get(k) is not None else v for k, v in _GENERATE_DEFAULTS.items()}
    return {**rules, "max_tokens": None}  # the prior stops after its grid (prior.py)


def resolve_glm_image(files: ModelFiles, deploy: PipelineDeployConfig) -> PipelineSpec:
    return PipelineSpec(name="glm_image", stages=(
        StageSpec(id=PRIOR, name="prior", kind="ar", output="tokens", model="glm_image.prior",
                  input_processor=prior_inputs, defaults={"default_sampling_params": prior_sampling(files)}),
        StageSpec(id=DIT, name="dit", kind="diffusion", output="image", inputs=(PRIOR,), final_output=True,
                  model="GlmImagePipeline", input_processor=dit_stage_inputs,
                  # Step mode by default: 0.993x request mode's throughput on the tiny glm-image, at least
                  # the 0.95x of issue 30 (benchmarks/RESULTS.md "Step mode vs request mode").
                  defaults={"step_execution": True},
        ),
    ))


register_ar_model("glm_image.prior", "omnistage.models.glm_image.prior:GlmImagePrior")
register_diffusion_pipeline("GlmImagePipeline", "omnistage.models.glm_image.pipeline:GlmImage")
register_pipeline("GlmImagePipeline", resolve_glm_image, deploy_config="glm_image.yaml")
