"""FLUX.1: CLIP (pooled) + T5 text encoders, an MMDiT over packed 2x2 latent patches.

Reproduces `diffusers.FluxPipeline` (pipelines/flux/pipeline_flux.py), split at the
encode / denoise_step / decode seams. Guidance-distilled checkpoints (dev) take
`guidance_scale` as an embedding (`transformer.config.guidance_embeds`); schnell has none.
True CFG (a second, negative-prompt pass) runs when `true_cfg_scale > 1` and the request
has a `negative_prompt`, as in diffusers. IP-Adapter inputs are not supported.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg
from omnistage.diffusion.accel.step_cache import BlockChain
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.patch_pipeline import PatchImagePipeline
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionRequest,
    current_timesteps,
    decode_images,
    encode_prompts_by_length,
    group_by,
    map_groups,
    pack_latents,
    pooled_prompt_cond,
    set_flow_match_timesteps,
    split_per_state,
    unpack_latents,
)
from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, Accelerations
from omnistage.models.flux.parallel import SEQUENCE_PLAN, TENSOR_PLAN


class Flux(PatchImagePipeline):
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
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        n = params.num_outputs_per_prompt
        latent_h = 2 * (params.height // self.multiple_of)
        latent_w = 2 * (params.width // self.multiple_of)
        embeds = prompt[0]
        # Noise is drawn unpacked, as one [n, C, H, W] tensor from the request's own generator,
        # exactly as diffusers draws it for num_images_per_prompt=n.
        shape = (n, self.transformer.config.in_channels // 4, latent_h, latent_w)
        latents = randn_tensor(shape, generator=self.generator_for(request), device=self.device, dtype=embeds.dtype)
        latents = pack_latents(latents)

        noise_scheduler = self.noise_scheduler_copy()
        num_steps = params.num_inference_steps
        sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
        if noise_scheduler.config.get("use_flow_sigmas", False):
            sigmas = None  # the noise scheduler builds its own flow sigmas (e.g. UniPC): only the step count
        timesteps = set_flow_match_timesteps(noise_scheduler, sigmas, latents.shape[1], self.device, num_steps=num_steps)

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

    # -- 3. denoise -----------------------------------------------------------------------

    # True CFG (a negative-prompt pass, plain CFG rule) when the request has a negative prompt
    # and true_cfg_scale > 1; each branch its own call, as in diffusers. The distilled
    # `guidance_scale` of dev checkpoints is a transformer input, not a branch.
    guidance: ClassVar[Guidance] = Guidance(
        scale=lambda s: s.cond["true_cfg_scale"] if s.cond["negative_prompt_embeds"] is not None else None,
        combine=plain_cfg,
    )

    # Step caches wrap the dual-stream then the single-stream blocks. TeaCache's coefficients
    # are TeaCache's own for FLUX.1 (ali-vilab/TeaCache, TeaCache4FLUX/teacache_flux.py).
    step_cache_blocks: ClassVar[BlockChain] = BlockChain(
        blocks=("transformer_blocks", "single_transformer_blocks"),
        io="dual_stream",
        modulated_input=lambda block, args, kwargs: flux_modulated_input(block, kwargs),
        tea_cache_coefficients=(4.98651651e02, -2.83781631e02, 5.58554382e01, -3.82021401e00, 2.64230861e-01),
        split_tokens=("image tokens",),
    )

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        for group in group_by(states, self._group_key):
            self._denoise_group(group)

    def _group_key(self, state: DenoiseState) -> tuple:
        """States with equal keys share a transformer call. The position ids are shared across
        a call, so its states need the same latent grid (not just token count: 32x64 and 64x32
        have equal ones) and prompt length."""
        return (state.request.params.height, state.request.params.width, state.cond["prompt_embeds"].shape[1])

    def _denoise_group(self, states: list[DenoiseState]) -> None:
        for state, pred in zip(states, self.guided_predictions(states, self._predict)):
            self.noise_scheduler_step(state, pred)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """The transformer's prediction for one branch's rows, one per state; timesteps and
        guidance are per sample."""
        states = [s for s, _ in rows]
        branch = rows[0][1]
        prefix = "" if branch == "cond" else "negative_"
        latents = torch.cat([s.latents for s in states])
        hidden_states = torch.cat([self._model_input(s) for s in states])
        timestep = current_timesteps(states).to(latents.dtype)
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.cat([torch.full((s.latents.shape[0],), s.cond["guidance_scale"],
                                             device=self.device, dtype=torch.float32) for s in states])
        with self.transformer.cache_context(branch):
            noise_pred = self.transformer(
                hidden_states=hidden_states,
                timestep=timestep / 1000,
                guidance=guidance,
                pooled_projections=torch.cat([s.cond[f"{prefix}pooled_prompt_embeds"] for s in states]),
                encoder_hidden_states=torch.cat([s.cond[f"{prefix}prompt_embeds"] for s in states]),
                txt_ids=states[0].cond["text_ids"],
                img_ids=states[0].cond["latent_image_ids"],
                return_dict=False,
            )[0]
        # Kontext also predicts the input image's tokens appended after the target's.
        return split_per_state(noise_pred[:, : latents.shape[1]], states)

    def _model_input(self, state: DenoiseState) -> torch.Tensor:
        """The transformer's image tokens for `state`: its latents (Kontext: plus the input image's)."""
        return state.latents

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # States with the same image size share one VAE call.
        return map_groups(states, lambda s: (s.request.params.height, s.request.params.width), self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        params = states[0].request.params
        latents = unpack_latents(torch.cat([s.latents for s in states]), 2 * (params.height // self.multiple_of),
                                 2 * (params.width // self.multiple_of))
        return decode_images(self.vae, self.image_processor, latents, states, self.vae_decode)


def flux_modulated_input(block: Any, kwargs: dict) -> torch.Tensor:
    """TeaCache's input: the first block's AdaLN-Zero-normed, timestep-modulated image tokens."""
    return block.norm1(kwargs["hidden_states"], emb=kwargs["temb"])[0]
