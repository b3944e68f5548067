"""ERNIE-Image: a Mistral-3 text encoder read at its penultimate layer, a single-stream DiT
over image and text tokens, the FLUX.2 VAE (latents patchified 2x2, batch-normalised).

Reproduces `diffusers.ErnieImagePipeline` (pipelines/ernie_image/pipeline_ernie_image.py),
split at the encode / denoise_step / decode seams. CFG runs when `guidance_scale > 1`, on the
negative prompt ("" by default); both branches share one transformer call, as in diffusers.
Each prompt keeps its own token count: the DiT takes the text padded to the longest in the call
with the true lengths (`text_lens`), which mask the padding out.
Not run: the prompt enhancer (`pe`: an LLM that rewrites the prompt by sampling, diffusers'
`use_pe`); a request is generated from the prompt it gives, as with `use_pe=False`, and the
checkpoint's `pe` is not loaded.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg, scale_if_negative
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_divisible,
    current_timesteps,
    encode_prompt_pairs,
    latent_shape,
    map_groups,
    split_per_state,
)
from omnistage.diffusion.accel.declaration import Accelerations

# diffusers' ERNIE-Image pipeline denormalises with this epsilon, not the VAE config's batch_norm_eps.
BN_EPS = 1e-5


class ErnieImage(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "ErnieImagePipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        cfg_parallel=True, fsdp=True, vae_tiling=True, offload=True, quantization=True, lora=True, compile=True,
        refused={"cache_backend": "its blocks run sequence-first"})
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->vae"
    # The prompt enhancer (a causal LM, billions of parameters in the real checkpoint) is never run.
    _optional_components: ClassVar[list[str]] = ["pe", "pe_tokenizer"]
    loader_overrides: ClassVar[dict[str, Any]] = {"pe": None, "pe_tokenizer": None}
    # ErnieImagePipeline.__call__ defaults (fixed sizes, not the checkpoint's).
    default_params: ClassVar[dict[str, Any]] = {
        "height": 1024,
        "width": 1024,
        "num_inference_steps": 50,
        "guidance_scale": 4.0,
    }

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.image_processor import VaeImageProcessor

        super().__init__(components, device, dtype, configs)
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.vae_scale_factor)

    def configure(self, configs: CheckpointConfigs) -> None:
        # The VAE's 2**(blocks - 1) times the 2x2 patchify: one latent token per 16 pixels.
        self.vae_scale_factor = 2 ** len(configs.vae.block_out_channels)

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        check_divisible(request.params, height=self.vae_scale_factor, width=self.vae_scale_factor)

    # -- 2. encode: prompts, initial noise, timesteps ---------------------------------------

    def _encode_prompts(self, prompts: list[str]) -> list[torch.Tensor]:
        """Each prompt's penultimate hidden states [T_i, D] (ErnieImagePipeline.encode_prompt),
        in one right-padded, masked text-encoder call: a causal encoder's real tokens never see
        the padding, so each equals its prompt encoded alone. An empty prompt is its BOS token."""
        ids = [self.tokenizer(p, add_special_tokens=True, truncation=True, padding=False)["input_ids"] or
               [self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else 0] for p in prompts]
        longest = max(len(i) for i in ids)
        input_ids = torch.zeros(len(ids), longest, dtype=torch.long)
        mask = torch.zeros(len(ids), longest, dtype=torch.long)
        for row, tokens in enumerate(ids):
            input_ids[row, : len(tokens)] = torch.tensor(tokens)
            mask[row, : len(tokens)] = 1
        out = self.text_encoder(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                                output_hidden_states=True)
        return [hidden[: len(tokens)] for hidden, tokens in zip(out.hidden_states[-2], ids)]

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # One text-encoder call over every prompt, then the negative prompts of the requests
        # that run CFG (guidance_scale > 1).
        embeds = encode_prompt_pairs(requests, uses_cfg=lambda r: r.params.guidance_scale > 1,
                                     encode=self._encode_prompts)
        return [self._initial_state(r, prompt, negative) for r, (prompt, negative) in zip(requests, embeds)]

    def _initial_state(self, request: DiffusionRequest, prompt: torch.Tensor,
                       negative: torch.Tensor | None) -> DenoiseState:
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        dtype = self.transformer.dtype
        shape = (params.num_outputs_per_prompt, self.transformer.config.in_channels,
                 params.height // self.vae_scale_factor, params.width // self.vae_scale_factor)
        latents = randn_tensor(shape, generator=self.generator_for(request), device=self.device, dtype=dtype)
        noise_scheduler = self.noise_scheduler_copy()
        # diffusers' schedule: linear sigmas from 1, the last (0) left out; the scheduler shifts them.
        noise_scheduler.set_timesteps(sigmas=torch.linspace(1.0, 0.0, params.num_inference_steps + 1)[:-1],
                                      device=self.device)
        noise_scheduler.set_begin_index(0)
        cond = {"prompt_embeds": prompt.to(dtype),
                "negative_prompt_embeds": None if negative is None else negative.to(dtype),
                "guidance_scale": params.guidance_scale}
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler,
                            timesteps=noise_scheduler.timesteps, cond=cond)

    # -- 3. denoise -----------------------------------------------------------------------

    # CFG when guidance_scale > 1, plain rule; both branches in one transformer call, as diffusers batches them.
    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative(), combine=plain_cfg, batch_branches=True)

    # No step caches: the DiT's blocks run sequence-first ([tokens, batch, dim]), and the caches
    # split a call by its leading (batch) rows.

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # One transformer call needs equal latent sizes; prompt lengths may differ (text_lens).
        self.guided_steps(states, latent_shape, self._predict)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """One transformer call over every (state, branch) row; one prediction per row."""
        row_states = [s for s, _ in rows]
        texts = [s.cond["prompt_embeds" if branch == "cond" else "negative_prompt_embeds"]
                 for s, branch in rows for _ in range(s.latents.shape[0])]
        text_lens = torch.tensor([t.shape[0] for t in texts], device=self.device)
        text_bth = torch.zeros(len(texts), int(text_lens.max()), texts[0].shape[-1], device=self.device,
                               dtype=texts[0].dtype)
        for i, t in enumerate(texts):
            text_bth[i, : t.shape[0]] = t
        latents = torch.cat([s.latents for s in row_states])
        pred = self.transformer(
            hidden_states=latents,
            timestep=current_timesteps(row_states).to(latents.dtype),
            text_bth=text_bth,
            text_lens=text_lens,
            return_dict=False,
        )[0]
        return split_per_state(pred, row_states)

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # States with the same latent size share one VAE call.
        return map_groups(states, latent_shape, self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        from diffusers import ErnieImagePipeline

        latents = torch.cat([s.latents for s in states])
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(latents.device, latents.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + BN_EPS).to(latents.device, latents.dtype)
        latents = ErnieImagePipeline._unpatchify_latents(latents * std + mean)
        images = self.vae_decode(latents.to(self.vae.dtype))
        return split_per_state(self.image_processor.postprocess(images, output_type="np"), states)
