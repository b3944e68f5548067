"""Stable Diffusion 3 / 3.5: two CLIP text encoders + T5, an MMDiT, classifier-free guidance.

Reproduces `diffusers.StableDiffusion3Pipeline`
(pipelines/stable_diffusion_3/pipeline_stable_diffusion_3.py), split at the encode /
denoise_step / decode seams. CFG runs when `guidance_scale > 1`, with the negative prompt
"" by default; the cond and uncond branches share one transformer call, as in diffusers.
Not supported: skip-layer guidance, clip_skip, IP-Adapter.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg, scale_if_negative
from omnistage.diffusion.accel.step_cache import BlockChain
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_divisible,
    current_timesteps,
    decode_images,
    encode_prompts_by_length,
    latent_shape,
    map_groups,
    pooled_prompt_cond,
    split_per_state,
)
from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, Accelerations
from omnistage.models.sd3.parallel import SEQUENCE_PLAN, TENSOR_PLAN


class StableDiffusion3(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "StableDiffusion3Pipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        step_caches=CACHE_BACKENDS, cfg_parallel=True, sequence_parallel=SEQUENCE_PLAN, tensor_parallel=TENSOR_PLAN,
        vae_patch_parallel=True, vae_tiling=True, offload=True, quantization=True, lora=True,
        refused={"compile": "its transformer declares no repeated blocks"})
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->text_encoder_2->text_encoder_3->transformer->vae"
    # text_encoder_3 (T5) may be left out of a checkpoint: its embeddings are then zeros.
    # image_encoder/feature_extractor are loaded when present, unused (no IP-Adapter).
    _optional_components: ClassVar[list[str]] = ["text_encoder_3", "tokenizer_3", "image_encoder",
                                                 "feature_extractor"]
    # StableDiffusion3Pipeline.__call__ defaults; height/width (transformer sample_size times
    # the VAE factor) depend on the checkpoint and are filled in __init__.
    default_params: ClassVar[dict[str, Any]] = {
        "num_inference_steps": 28,
        "guidance_scale": 7.0,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, max_from=("tokenizer_3",), default=256, min=1, max=512,
                                         help="T5 prompt tokens (the prompt is padded to this length)."),
    }

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.image_processor import VaeImageProcessor

        super().__init__(components, device, dtype, configs)
        self.text_encoder_3 = components.get("text_encoder_3")
        self.tokenizer_3 = components.get("tokenizer_3")
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.vae_scale_factor)
        self.tokenizer_max_length = self.tokenizer.model_max_length

    def configure(self, configs: CheckpointConfigs) -> None:
        self.vae_scale_factor = 2 ** (len(configs.vae.block_out_channels) - 1)
        self.patch_size = configs.transformer.patch_size
        # Latents are cut into patch_size x patch_size patches.
        self.multiple_of = self.vae_scale_factor * self.patch_size
        size = configs.transformer.sample_size * self.vae_scale_factor
        self.default_params = {**type(self).default_params, "height": size, "width": size}

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params  # defaults filled (prepare_request)
        check_divisible(params, height=self.multiple_of, width=self.multiple_of)

    # -- 2. encode: prompts, initial noise, timesteps ---------------------------------------

    def _clip_embeds(self, tokenizer: Any, text_encoder: Any, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(penultimate hidden state [N, 77, D], projected pooled output [N, D]) of one CLIP."""
        ids = tokenizer(prompts, padding="max_length", max_length=self.tokenizer_max_length,
                        truncation=True, return_tensors="pt").input_ids
        out = text_encoder(ids.to(self.device), output_hidden_states=True)
        return out.hidden_states[-2].to(self.text_encoder.dtype), out[0]

    def _t5_embeds(self, prompts: list[str], max_sequence_length: int) -> torch.Tensor:
        if self.text_encoder_3 is None:
            # Without T5 diffusers feeds zeros of the transformer's joint_attention_dim.
            return torch.zeros(len(prompts), max_sequence_length, self.transformer.config.joint_attention_dim,
                               device=self.device, dtype=self.dtype)
        ids = self.tokenizer_3(prompts, padding="max_length", max_length=max_sequence_length, truncation=True,
                               add_special_tokens=True, return_tensors="pt").input_ids
        return self.text_encoder_3(ids.to(self.device))[0].to(self.text_encoder_3.dtype)

    def _encode_prompts(self, prompts: list[str], max_sequence_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(joint embeddings [N, 77 + max_sequence_length, D], pooled [N, D1 + D2]) for N
        prompts (StableDiffusion3Pipeline.encode_prompt): the two CLIPs' hidden states side
        by side, zero-padded to T5's width, then T5's tokens appended. No encoder gets an
        attention mask, so a prompt's embedding is the same in a batch as alone."""
        clip_1, pooled_1 = self._clip_embeds(self.tokenizer, self.text_encoder, prompts)
        clip_2, pooled_2 = self._clip_embeds(self.tokenizer_2, self.text_encoder_2, prompts)
        t5 = self._t5_embeds(prompts, max_sequence_length)
        clip = torch.cat([clip_1, clip_2], dim=-1)
        clip = torch.nn.functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        return torch.cat([clip, t5], dim=-2), torch.cat([pooled_1, pooled_2], dim=-1)

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # Requests with the same max_sequence_length share one call per text encoder; each
        # row is (joint embeddings, pooled). CFG runs when guidance_scale > 1.
        embeds = encode_prompts_by_length(
            requests,
            uses_cfg=lambda r: r.params.guidance_scale > 1,
            encode=lambda texts, max_len: list(zip(*self._encode_prompts(texts, max_len))),
        )
        return [self._initial_state(r, prompt, negative) for r, (prompt, negative) in zip(requests, embeds)]

    def _initial_state(self, request: DiffusionRequest, prompt: tuple[torch.Tensor, torch.Tensor],
                       negative: tuple[torch.Tensor, torch.Tensor] | None) -> DenoiseState:
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        n = params.num_outputs_per_prompt
        embeds = prompt[0]
        shape = (n, self.transformer.config.in_channels, params.height // self.vae_scale_factor,
                 params.width // self.vae_scale_factor)
        latents = randn_tensor(shape, generator=self.generator_for(request), device=self.device, dtype=embeds.dtype)

        noise_scheduler = self.noise_scheduler_copy()
        kwargs = {}
        # SD3.5 checkpoints may shift the schedule by resolution (dynamic shifting); SD3 uses
        # a fixed shift from the noise scheduler's config.
        if noise_scheduler.config.get("use_dynamic_shifting", None):
            image_seq_len = (shape[2] // self.patch_size) * (shape[3] // self.patch_size)
            kwargs["mu"] = calculate_shift(
                image_seq_len,
                noise_scheduler.config.get("base_image_seq_len", 256),
                noise_scheduler.config.get("max_image_seq_len", 4096),
                noise_scheduler.config.get("base_shift", 0.5),
                noise_scheduler.config.get("max_shift", 1.16),
            )
        timesteps, _ = retrieve_timesteps(noise_scheduler, params.num_inference_steps, self.device, **kwargs)
        noise_scheduler.set_begin_index(0)

        cond: dict[str, Any] = {**pooled_prompt_cond(prompt, negative, n), "guidance_scale": params.guidance_scale}
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler, timesteps=timesteps, cond=cond)

    # -- 3. denoise -----------------------------------------------------------------------

    # CFG when guidance_scale > 1 (the negative prompt "" by default), plain rule; SD3's
    # transformer takes both branches in one call, as diffusers batches them.
    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative(), combine=plain_cfg, batch_branches=True)

    # Step caches wrap the joint blocks. TeaCache publishes no coefficients for SD3: no rescaling.
    step_cache_blocks: ClassVar[BlockChain] = BlockChain(
        blocks=("transformer_blocks",),
        io="dual_stream",
        modulated_input=lambda block, args, kwargs: sd3_modulated_input(block, kwargs),
        split_tokens=("image tokens",),
    )

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # One transformer call needs equal latent sizes and prompt lengths.
        self.guided_steps(states, lambda s: (latent_shape(s), s.cond["prompt_embeds"].shape[1]), self._predict)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """One transformer call over every row (cond and uncond together); one prediction per row."""
        row_states = [s for s, _ in rows]
        prefixes = ["" if branch == "cond" else "negative_" for _, branch in rows]
        noise_pred = self.transformer(
            hidden_states=torch.cat([s.latents for s in row_states]),
            timestep=current_timesteps(row_states),
            encoder_hidden_states=torch.cat([s.cond[f"{p}prompt_embeds"] for s, p in zip(row_states, prefixes)]),
            pooled_projections=torch.cat([s.cond[f"{p}pooled_prompt_embeds"] for s, p in zip(row_states, prefixes)]),
            return_dict=False,
        )[0]
        return split_per_state(noise_pred, row_states)

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # States with the same latent size share one VAE call.
        return map_groups(states, latent_shape, self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        latents = torch.cat([s.latents for s in states])
        return decode_images(self.vae, self.image_processor, latents, states, self.vae_decode)


def sd3_modulated_input(block: Any, kwargs: dict) -> torch.Tensor:
    """TeaCache's input: the first joint block's AdaLN-Zero-normed, modulated image tokens."""
    return block.norm1(kwargs["hidden_states"], emb=kwargs["temb"])[0]
