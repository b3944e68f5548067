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

import numpy as np
import torch

from omnistage.diffusion.accel.step_cache import BlockChain
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg
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
    set_flow_match_timesteps,
    split_per_state,
    unpack_latents,
)
from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, Accelerations

# OvisImagePipeline.__init__'s prompt facts: the system prompt put before every user prompt,
# and how many leading tokens (chat header and system prompt) the embeddings drop.
SYSTEM_PROMPT = ("Describe the image by detailing the color, quantity, text, shape, size, texture, spatial "
                 "relationships of the objects and background: ")
USER_PROMPT_BEGIN_ID = 28


class OvisImage(PatchImagePipeline):
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
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        n = params.num_outputs_per_prompt
        latent_h, latent_w = 2 * (params.height // self.multiple_of), 2 * (params.width // self.multiple_of)
        # Noise is drawn unpacked, as one [n, C, H, W] tensor from the request's own generator.
        shape = (n, self.transformer.config.in_channels // 4, latent_h, latent_w)
        latents = pack_latents(randn_tensor(shape, generator=self.generator_for(request), device=self.device,
                                            dtype=prompt.dtype))
        noise_scheduler = self.noise_scheduler_copy()
        num_steps = params.num_inference_steps
        sigmas = None if noise_scheduler.config.get("use_flow_sigmas", False) else np.linspace(1.0, 1 / num_steps,
                                                                                              num_steps)
        timesteps = set_flow_match_timesteps(noise_scheduler, sigmas, latents.shape[1], self.device,
                                             num_steps=num_steps)

        def repeat(embeds: torch.Tensor | None) -> torch.Tensor | None:
            return None if embeds is None else embeds.unsqueeze(0).expand(n, *embeds.shape)

        # Text token i sits at (0, i, i); image tokens at (0, row, col) of the latent grid.
        text_ids = torch.zeros(prompt.shape[0], 3)
        text_ids[:, 1] = text_ids[:, 2] = torch.arange(prompt.shape[0])
        cond = {
            "prompt_embeds": repeat(prompt),
            "negative_prompt_embeds": repeat(negative),
            "text_ids": text_ids.to(self.device, prompt.dtype),
            "latent_image_ids": FluxPipeline._prepare_latent_image_ids(n, latent_h // 2, latent_w // 2, self.device,
                                                                        prompt.dtype),
            "guidance_scale": params.guidance_scale,
        }
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler, timesteps=timesteps,
                            cond=cond)

    # -- 3. denoise -----------------------------------------------------------------------

    # CFG when guidance_scale > 1, plain rule; each branch its own call, as in diffusers.
    guidance: ClassVar[Guidance] = Guidance(
        scale=lambda s: s.cond["guidance_scale"] if s.cond["negative_prompt_embeds"] is not None else None,
        combine=plain_cfg,
    )
    # Step caches wrap the dual-stream then the single-stream blocks (FLUX's layout: keyword
    # inputs, (text, image) outputs). TeaCache compares the first block's AdaLN-Zero-normed,
    # timestep-modulated image tokens; no coefficients are published for Ovis-Image: no rescaling.
    step_cache_blocks: ClassVar[BlockChain] = BlockChain(
        blocks=("transformer_blocks", "single_transformer_blocks"),
        io="dual_stream",
        modulated_input=lambda block, args, kwargs: block.norm1(kwargs["hidden_states"], emb=kwargs["temb"])[0],
    )

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # The position ids are shared across a transformer call: equal latent grids and prompt lengths.
        def key(s: DenoiseState) -> tuple:
            return (s.request.params.height, s.request.params.width, s.cond["prompt_embeds"].shape[1])

        for group in group_by(states, key):
            for state, pred in zip(group, self.guided_predictions(group, self._predict)):
                self.noise_scheduler_step(state, pred)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """The transformer's prediction for one branch's rows, one per state."""
        states = [s for s, _ in rows]
        branch = rows[0][1]
        prefix = "" if branch == "cond" else "negative_"
        latents = torch.cat([s.latents for s in states])
        with self.transformer.cache_context(branch):
            pred = self.transformer(
                hidden_states=latents,
                timestep=current_timesteps(states).to(latents.dtype) / 1000,
                encoder_hidden_states=torch.cat([s.cond[f"{prefix}prompt_embeds"] for s in states]),
                txt_ids=states[0].cond["text_ids"],
                img_ids=states[0].cond["latent_image_ids"],
                return_dict=False,
            )[0]
        return split_per_state(pred, states)

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
