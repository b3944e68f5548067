"""Z-Image: a Qwen3 text encoder, a single-stream DiT and a 16-channel AutoencoderKL.

Reproduces `diffusers.ZImagePipeline` (pipelines/z_image/pipeline_z_image.py), split at
the encode / denoise_step / decode seams. The transformer takes *lists* of latents and
caption embeddings and pads them itself, so one call mixes requests with different
prompt lengths, image sizes, step positions and guidance settings.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.guidance import Guidance, Rows, norm_clamped_cfg
from omnistage.diffusion.accel.step_cache import BlockChain
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.patch_pipeline import PatchImagePipeline
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionRequest,
    decode_images,
    encode_prompts_by_length,
    latent_grid,
    latent_shape,
    map_groups,
    set_flow_match_timesteps,
)
from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, Accelerations
from omnistage.models.z_image.parallel import SEQUENCE_PLAN, TENSOR_PLAN


class ZImage(PatchImagePipeline):
    reference_class: ClassVar[str] = "ZImagePipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        step_caches=CACHE_BACKENDS, cfg_parallel=True, sequence_parallel=SEQUENCE_PLAN, tensor_parallel=TENSOR_PLAN,
        fsdp=True, vae_patch_parallel=True,
        vae_tiling=True, offload=True, quantization=True, lora=True, compile=True)
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->vae"
    _optional_components: ClassVar[list[str]] = []
    # ZImagePipeline.__call__ defaults.
    default_params: ClassVar[dict[str, Any]] = {
        "height": 1024,
        "width": 1024,
        "num_inference_steps": 50,
        "guidance_scale": 5.0,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, default=512, min=1,
                                         max_from=("tokenizer", "text_encoder"),
                                         help="Prompt tokens kept (padded to this length)."),
        # diffusers types it as a bool but uses it as a factor: the guided prediction's norm
        # is capped at cfg_normalization * |cond prediction| (True there = 1.0 here; 0 = off).
        "cfg_normalization": ExtraSpec(float, default=0.0, min=0.0,
                                       help="Cap the CFG output norm at this multiple of the cond norm; 0 = off."),
        "cfg_truncation": ExtraSpec(float, default=1.0, min=0.0,
                                    help="Drop CFG on steps where (1000 - t) / 1000 exceeds this; 1.0 = never."),
    }

    # -- 1. check inputs: sizes divide by multiple_of (PatchImagePipeline) ------------------

    # -- 2. encode: prompts, initial noise, timesteps ---------------------------------------

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # One text-encoder call per distinct max_sequence_length. The negative prompt is only
        # encoded when CFG is on (guidance_scale > 0), as in diffusers.
        embeds = encode_prompts_by_length(requests, uses_cfg=lambda r: r.params.guidance_scale > 0,
                                          encode=self._encode_prompts)
        return [self._initial_state(r, *e) for r, e in zip(requests, embeds)]

    def _encode_prompts(self, prompts: list[str], max_length: int) -> list[torch.Tensor]:
        """One [num_tokens, dim] embedding per prompt: the second-to-last hidden state of the
        chat-templated prompt with padding dropped (ZImagePipeline._encode_prompt)."""
        texts = [
            self.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True, enable_thinking=True)
            for p in prompts
        ]
        # Padded to max_length like diffusers, so a prompt encoded in a batch sees exactly the
        # token positions it sees alone.
        tokens = self.tokenizer(texts, padding="max_length", max_length=max_length, truncation=True,
                                return_tensors="pt")
        masks = tokens.attention_mask.to(self.device).bool()
        hidden = self.text_encoder(input_ids=tokens.input_ids.to(self.device), attention_mask=masks,
                                   output_hidden_states=True).hidden_states[-2]
        return [h[m] for h, m in zip(hidden, masks)]

    def _initial_state(self, request: DiffusionRequest, prompt_embeds: torch.Tensor,
                       negative_embeds: torch.Tensor | None) -> DenoiseState:
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        latent_h, latent_w = latent_grid(params, self.multiple_of)
        # Z-Image keeps latents in float32 whatever the transformer dtype, as diffusers does.
        shape = (params.num_outputs_per_prompt, self.transformer.config.in_channels, latent_h, latent_w)
        latents = randn_tensor(shape, generator=self.generator_for(request), device=self.device, dtype=torch.float32)

        # Z-Image's own sigmas, shifted by the noise scheduler config's rules.
        num_steps = params.num_inference_steps
        noise_scheduler = self.noise_scheduler_copy()
        sigmas = torch.linspace(1.0, 1 / num_steps, num_steps).tolist()
        timesteps = set_flow_match_timesteps(noise_scheduler, sigmas, (latent_h // 2) * (latent_w // 2), self.device)
        # The CFG scale of every step, decided up front (no device sync per step): none without
        # a negative branch, and none once (1000 - t) / 1000 passes cfg_truncation.
        t_norms = ((1000 - timesteps.float()) / 1000).tolist()
        truncation = params.extras["cfg_truncation"]
        cfg_scales = [params.guidance_scale if negative_embeds is not None and t <= truncation else 0.0
                      for t in t_norms]
        return DenoiseState(
            request=request,
            latents=latents,
            noise_scheduler=noise_scheduler,
            timesteps=timesteps,
            cond={
                "prompt_embeds": prompt_embeds,
                "negative_prompt_embeds": negative_embeds,
                "cfg_scales": cfg_scales,
                "cfg_normalization": params.extras["cfg_normalization"],
            },
        )

    # -- 3. denoise -----------------------------------------------------------------------

    # Z-Image's CFG: the scale of every step decided in encode ("cfg_scales", 0 = no uncond
    # branch), cond and uncond rows in one call (as diffusers stacks pos + neg), a norm clamp.
    guidance: ClassVar[Guidance] = Guidance(
        scale=lambda s: s.cond["cfg_scales"][s.step_index] or None,
        combine=norm_clamped_cfg,
        batch_branches=True,
    )

    # Step caches wrap the main layers (the noise and context refiners always run); the
    # layers' second argument masks each row's padding. TeaCache publishes no Z-Image
    # coefficients: no rescaling.
    step_cache_blocks: ClassVar[BlockChain] = BlockChain(
        blocks=("layers",),
        io="single_stream",
        token_mask_arg=1,
        modulated_input=lambda block, args, kwargs: z_image_modulated_input(block, args),
    )

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        for state, pred in zip(states, self.guided_predictions(states, self._predict)):
            # The transformer predicts the flow towards the data; the noise scheduler steps along its negation.
            noise_pred = -pred.squeeze(2)
            self.noise_scheduler_step(state, noise_pred.to(torch.float32))

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """One transformer call over every latent of every row (the transformer takes lists and
        pads them itself); each row's predictions stacked, in float32."""
        latents, timesteps, captions = [], [], []
        for state, branch in rows:
            t = (1000 - state.timesteps[state.step_index]) / 1000  # the transformer counts time up from noise
            embeds = state.cond["prompt_embeds" if branch == "cond" else "negative_prompt_embeds"]
            for latent in state.latents.to(self.dtype):
                latents.append(latent.unsqueeze(1))  # [C, 1 frame, H, W]
                timesteps.append(t)
                captions.append(embeds)
        outputs = iter(self.transformer(latents, torch.stack(timesteps), captions, return_dict=False)[0])
        return [torch.stack([next(outputs).float() for _ in range(state.latents.shape[0])]) for state, _ in rows]

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        return map_groups(states, latent_shape, self._decode_group)  # one VAE call per size

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # Cast before un-scaling, as diffusers' Z-Image does.
        latents = torch.cat([s.latents for s in states]).to(self.vae.dtype)
        return decode_images(self.vae, self.image_processor, latents, states, self.vae_decode)


def z_image_modulated_input(block: Any, args: tuple) -> torch.Tensor:
    """TeaCache's input: the first main layer's normed tokens times its attention scale
    (ZImageTransformerBlock with one modulation for every token)."""
    x, adaln_input = args[0], args[3]
    scale_msa = 1.0 + block.adaLN_modulation(adaln_input).unsqueeze(1).chunk(4, dim=2)[0]
    return block.attention_norm1(x) * scale_msa
