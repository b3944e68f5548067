"""FLUX.1: CLIP (pooled) + T5 text encoders, an MMDiT over packed 2x2 latent patches.

Reproduces `diffusers.FluxPipeline` (pipelines/flux/pipeline_flux.py), split at the
encode / denoise_step / decode seams. Guidance-distilled checkpoints (dev) take
`guidance_scale` as an embedding (`transformer.config.guidance_embeds`); schnell has none.
True CFG (a second, negative-prompt pass) runs when `true_cfg_scale > 1` and the request
has a `negative_prompt`, as in diffusers. IP-Adapter inputs are not supported.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, plain_cfg, scale_if_negative
from omnistage.diffusion.accel.step_cache import BlockChain
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.patch_pipeline import FluxStylePipeline
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionRequest,
    encode_prompts_by_length,
    latent_grid,
    pooled_prompt_cond,
)
from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, Accelerations
from omnistage.models.flux.parallel import SEQUENCE_PLAN, TENSOR_PLAN


class Flux(FluxStylePipeline):
    reference_class: ClassVar[str] = "FluxPipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        step_caches=CACHE_BACKENDS, cfg_parallel=True, sequence_parallel=SEQUENCE_PLAN, tensor_parallel=TENSOR_PLAN,
        fsdp=True, vae_patch_parallel=True, vae_tiling=True, offload=True, quantization=True, lora=True, compile=True)
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->text_encoder_2->transformer->vae"
    # Loaded when the checkpoint has them, unused: IP-Adapter is not supported.
    _optional_components: ClassVar[list[str]] = ["image_encoder", "feature_extractor"]
    # FluxPipeline.__call__ defaults; height/width (128 latent pixels times the VAE factor)
    # depend on the checkpoint and are filled in __init__.
    default_params: ClassVar[dict[str, Any]] = {
        "num_inference_steps": 28,
        "guidance_scale": 3.5,
        "true_cfg_scale": 1.0,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, max_from=("tokenizer_2",), default=512, min=1, max=512,
                                         help="T5 prompt tokens (the prompt is padded to this length)."),
    }
    default_sample_size: ClassVar[int] = 128  # FluxPipeline.default_sample_size, in latent pixels

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        super().__init__(components, device, dtype, configs)
        self.tokenizer_max_length = self.tokenizer.model_max_length

    # -- 1. check inputs: sizes divide by multiple_of (PatchImagePipeline) ------------------

    # -- 2. encode: prompts, initial noise, timesteps ---------------------------------------

    def _encode_prompts(self, prompts: list[str], max_sequence_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(T5 embeddings [N, max_sequence_length, D], CLIP pooled [N, D_pool]) for N prompts
        (FluxPipeline.encode_prompt). Neither encoder gets an attention mask, so padding to
        max_length makes a prompt's embedding the same in a batch as alone."""
        clip_ids = self.tokenizer(prompts, padding="max_length", max_length=self.tokenizer_max_length,
                                  truncation=True, return_tensors="pt").input_ids
        pooled = self.text_encoder(clip_ids.to(self.device), output_hidden_states=False).pooler_output
        t5_ids = self.tokenizer_2(prompts, padding="max_length", max_length=max_sequence_length,
                                  truncation=True, return_tensors="pt").input_ids
        embeds = self.text_encoder_2(t5_ids.to(self.device), output_hidden_states=False)[0]
        return embeds.to(self.text_encoder_2.dtype), pooled.to(self.text_encoder.dtype)

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # Requests with the same max_sequence_length share one call per text encoder; each
        # row is (T5 embeddings, CLIP pooled). True CFG needs both a scale above 1 and a
        # negative prompt (diffusers' rule).
        embeds = encode_prompts_by_length(
            requests,
            uses_cfg=lambda r: r.params.true_cfg_scale > 1 and r.params.negative_prompt is not None,
            encode=lambda texts, max_len: list(zip(*self._encode_prompts(texts, max_len))),
        )
        return [self._initial_state(r, prompt, negative) for r, (prompt, negative) in zip(requests, embeds)]

    def _initial_state(self, request: DiffusionRequest, prompt: tuple[torch.Tensor, torch.Tensor],
                       negative: tuple[torch.Tensor, torch.Tensor] | None) -> DenoiseState:
        from diffusers.pipelines.flux.pipeline_flux import FluxPipeline

        params = request.params
        n = params.num_outputs_per_prompt
        latent_h, latent_w = latent_grid(params, self.multiple_of)
        embeds = prompt[0]
        latents = self.packed_noise(request, embeds.dtype)
        noise_scheduler = self.noise_scheduler_copy()
        timesteps = self.flow_timesteps(noise_scheduler, params.num_inference_steps, latents.shape[1])

        cond: dict[str, Any] = {
            **pooled_prompt_cond(prompt, negative, n),
            # Text tokens all sit at position 0; image tokens at their (row, col) in the grid.
            "text_ids": torch.zeros(embeds.shape[0], 3, device=self.device, dtype=embeds.dtype),
            "latent_image_ids": FluxPipeline._prepare_latent_image_ids(n, latent_h // 2, latent_w // 2,
                                                                        self.device, embeds.dtype),
            "guidance_scale": params.guidance_scale,
            "true_cfg_scale": params.true_cfg_scale,
        }
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler, timesteps=timesteps, cond=cond)

    # -- 3. denoise: FluxStylePipeline's, with the pooled prompt and guidance embedding ------

    # True CFG (a negative-prompt pass, plain CFG rule) when the request has a negative prompt
    # and true_cfg_scale > 1; each branch its own call, as in diffusers. The distilled
    # `guidance_scale` of dev checkpoints is a transformer input, not a branch.
    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative("true_cfg_scale"), combine=plain_cfg)

    # Step caches wrap FLUX's blocks (FluxStylePipeline); TeaCache's coefficients are TeaCache's
    # own for FLUX.1 (ali-vilab/TeaCache, TeaCache4FLUX/teacache_flux.py).
    step_cache_blocks: ClassVar[BlockChain] = dataclasses.replace(
        FluxStylePipeline.step_cache_blocks,
        tea_cache_coefficients=(4.98651651e02, -2.83781631e02, 5.58554382e01, -3.82021401e00, 2.64230861e-01),
        split_tokens=("image tokens",),
    )

    def _transformer_inputs(self, states: list[DenoiseState], prefix: str) -> dict[str, Any]:
        # The CLIP pooled prompt, and dev's distilled guidance scale per sample.
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.cat([torch.full((s.latents.shape[0],), s.cond["guidance_scale"],
                                             device=self.device, dtype=torch.float32) for s in states])
        return {"guidance": guidance,
                "pooled_projections": torch.cat([s.cond[f"{prefix}pooled_prompt_embeds"] for s in states])}

    # -- 4. decode: FluxStylePipeline's ---------------------------------------------------
