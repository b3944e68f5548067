"""Ovis-Image: a Qwen3 text encoder read through its chat template, a FLUX-style MMDiT over
packed 2x2 latent patches (no pooled text, no guidance embedding), true CFG.

Reproduces `diffusers.OvisImagePipeline` (pipelines/ovis_image/pipeline_ovis_image.py), split
at the encode / denoise_step / decode seams. CFG runs when `guidance_scale > 1`, on the
negative prompt ("" by default), each branch its own transformer call, as in diffusers. Every
prompt is padded to `max_sequence_length` plus the chat header, so prompts share one length
and their padding is zeroed: a prompt's embedding is the same in a batch as alone.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from omnistage.diffusion.guidance import Guidance, plain_cfg, scale_if_negative
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.patch_pipeline import FluxStylePipeline
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionRequest,
    encode_prompts_by_length,
    latent_grid,
    repeat_per_output,
)
from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, Accelerations

# OvisImagePipeline.__init__'s prompt facts: the system prompt put before every user prompt,
# and how many leading tokens (chat header and system prompt) the embeddings drop.
SYSTEM_PROMPT = ("Describe the image by detailing the color, quantity, text, shape, size, texture, spatial "
                 "relationships of the objects and background: ")
USER_PROMPT_BEGIN_ID = 28


class OvisImage(FluxStylePipeline):
    reference_class: ClassVar[str] = "OvisImagePipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        step_caches=CACHE_BACKENDS, cfg_parallel=True, fsdp=True, vae_patch_parallel=True, vae_tiling=True, offload=True, quantization=True, compile=True)
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->vae"
    # OvisImagePipeline.__call__ defaults; height/width (128 latent pixels times the VAE factor)
    # depend on the checkpoint and are filled in `configure`.
    default_params: ClassVar[dict[str, Any]] = {
        "num_inference_steps": 50,
        "guidance_scale": 5.0,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, default=256, min=1, max=256,  # diffusers' limit
                                         help="Prompt tokens after the chat header (the prompt is padded to this "
                                              "length)."),
    }
    default_sample_size: ClassVar[int] = 128  # OvisImagePipeline.default_sample_size, in latent pixels

    # -- 1. check inputs: sizes divide by multiple_of (PatchImagePipeline) ------------------

    # -- 2. encode: prompts, initial noise, timesteps ---------------------------------------

    def _encode_prompts(self, prompts: list[str], max_sequence_length: int) -> torch.Tensor:
        """[N, max_sequence_length, D] for N prompts (OvisImagePipeline._get_ovis_prompt_embeds):
        each prompt after the system prompt in one user turn, thinking off, padded to the header
        plus `max_sequence_length`; the last hidden state, padding zeroed, header dropped."""
        texts = [self.tokenizer.apply_chat_template([{"role": "user", "content": SYSTEM_PROMPT + p}], tokenize=False,
                                                    add_generation_prompt=True, enable_thinking=False)
                 for p in prompts]
        tokens = self.tokenizer(texts, padding="max_length", truncation=True,
                                max_length=max_sequence_length + USER_PROMPT_BEGIN_ID, return_tensors="pt",
                                add_special_tokens=False)
        mask = tokens.attention_mask.to(self.device)
        hidden = self.text_encoder(input_ids=tokens.input_ids.to(self.device), attention_mask=mask).last_hidden_state
        return (hidden * mask[..., None])[:, USER_PROMPT_BEGIN_ID:]

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # Requests with the same max_sequence_length share one text-encoder call; CFG runs when
        # guidance_scale > 1, on "" unless a negative prompt is given.
        embeds = encode_prompts_by_length(
            requests,
            uses_cfg=lambda r: r.params.guidance_scale > 1,
            encode=lambda texts, max_len: list(self._encode_prompts(texts, max_len)),
        )
        return [self._initial_state(r, prompt, negative) for r, (prompt, negative) in zip(requests, embeds)]

    def _initial_state(self, request: DiffusionRequest, prompt: torch.Tensor,
                       negative: torch.Tensor | None) -> DenoiseState:
        from diffusers.pipelines.flux.pipeline_flux import FluxPipeline

        params = request.params
        n = params.num_outputs_per_prompt
        latent_h, latent_w = latent_grid(params, self.multiple_of)
        latents = self.packed_noise(request, prompt.dtype)
        noise_scheduler = self.noise_scheduler_copy()
        timesteps = self.flow_timesteps(noise_scheduler, params.num_inference_steps, latents.shape[1])

        # Text token i sits at (0, i, i); image tokens at (0, row, col) of the latent grid.
        text_ids = torch.zeros(prompt.shape[0], 3)
        text_ids[:, 1] = text_ids[:, 2] = torch.arange(prompt.shape[0])
        cond = {
            "prompt_embeds": repeat_per_output(prompt, n),
            "negative_prompt_embeds": repeat_per_output(negative, n),
            "text_ids": text_ids.to(self.device, prompt.dtype),
            "latent_image_ids": FluxPipeline._prepare_latent_image_ids(n, latent_h // 2, latent_w // 2, self.device,
                                                                        prompt.dtype),
            "guidance_scale": params.guidance_scale,
        }
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler, timesteps=timesteps,
                            cond=cond)

    # -- 3. denoise: FluxStylePipeline's (no TeaCache coefficients are published: no rescaling)

    # CFG when guidance_scale > 1, plain rule; each branch its own call, as in diffusers.
    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative(), combine=plain_cfg)

    # -- 4. decode: FluxStylePipeline's ---------------------------------------------------
