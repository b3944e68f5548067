"""Stable Diffusion XL: CLIP-L + CLIP-G text encoders, a UNet with text-time conditioning,
classifier-free guidance.

Reproduces `diffusers.StableDiffusionXLPipeline`
(pipelines/stable_diffusion_xl/pipeline_stable_diffusion_xl.py), split at the encode /
denoise_step / decode seams. CFG runs when `guidance_scale > 1`; without a negative prompt
the uncond embeddings are zeros when the checkpoint says `force_zeros_for_empty_prompt`
(base-1.0 does), as in diffusers. `guidance_rescale` is an extra. The size micro-conditioning
is diffusers' default: original and target size are the requested size, no crop.
`denoising_end` (an extra) stops the base at that fraction of the schedule, as in diffusers'
ensemble of experts; as the first stage of `sdxl_refiner` (refiner.py) it hands its latents on.
Not supported: `prompt_2` / `negative_prompt_2`, clip_skip, IP-Adapter, guidance-embedding
(LCM) UNets, the invisible watermark.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg, scale_if_negative
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_divisible,
    current_timesteps,
    encode_prompt_pairs,
    latent_shape,
    map_groups,
    repeat_per_output,
    split_per_state,
)
from omnistage.core.types import LatentPayload
from omnistage.diffusion.accel.declaration import Accelerations


def timestep_cutoff(noise_scheduler: Any, fraction: float) -> int:
    """The training timestep at `fraction` of the way from noise to image (diffusers'
    `discrete_timestep_cutoff` of `denoising_end` / `denoising_start`)."""
    num_train = noise_scheduler.config.num_train_timesteps
    return int(round(num_train - fraction * num_train))


def rescaled_cfg(state: DenoiseState, cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Plain CFG, then diffusers' `rescale_noise_cfg` toward the cond prediction's std by the
    request's `guidance_rescale` (skipped at 0, as diffusers skips it)."""
    from diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl import rescale_noise_cfg

    guided = plain_cfg(state, cond, uncond, scale)
    rescale = state.cond["guidance_rescale"]
    return rescale_noise_cfg(guided, cond, guidance_rescale=rescale) if rescale > 0 else guided


class StableDiffusionXL(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "StableDiffusionXLPipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        cfg_parallel=True, vae_tiling=True, vae_patch_parallel=True, offload=True, lora=True,
        refused={"cache_backend": "its denoiser is a UNet: the caches hook transformer blocks",
                 "quantization": "it has no transformer", "compile": "it has no transformer"})
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->text_encoder_2->unet->vae"
    # A checkpoint may carry only the CLIP-G encoder (as the refiner does); the image encoder
    # is loaded when present, unused (no IP-Adapter).
    _optional_components: ClassVar[list[str]] = ["tokenizer", "text_encoder", "image_encoder", "feature_extractor"]
    # StableDiffusionXLPipeline.__call__ defaults; height/width (the UNet's sample_size times
    # the VAE factor) depend on the checkpoint and are filled in `configure`.
    default_params: ClassVar[dict[str, Any]] = {
        "num_inference_steps": 50,
        "guidance_scale": 5.0,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "guidance_rescale": ExtraSpec(float, default=0.0, min=0.0, max=1.0,
                                      help="Rescales the guided prediction toward the cond one's std "
                                           "(arXiv:2305.08891 sec. 3.4); 0 = plain CFG."),
        "denoising_end": ExtraSpec(float, min=0.0, max=1.0,
                                   help="Stop at this fraction of the schedule (the base of an ensemble "
                                        "with the refiner); unset = denoise to the end."),
    }

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.image_processor import VaeImageProcessor

        super().__init__(components, device, dtype, configs)
        self.text_encoder = components.get("text_encoder")
        self.tokenizer = components.get("tokenizer")
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.vae_scale_factor)
        # diffusers upcasts an fp16 VAE flagged force_upcast around every decode (it overflows
        # in fp16); keeping it in fp32 does the same once.
        if self.vae.dtype == torch.float16 and self.vae.config.force_upcast:
            self.vae.to(torch.float32)
        # An ancestral or SDE noise scheduler draws its step noise from the generator it is given.
        self._step_takes_generator = "generator" in inspect.signature(self.noise_scheduler.step).parameters

    def configure(self, configs: CheckpointConfigs) -> None:
        if configs.unet.get("time_cond_proj_dim") is not None:
            raise ValueError("unet.time_cond_proj_dim: guidance-embedding (LCM-distilled) SDXL UNets are not supported")
        self.vae_scale_factor = 2 ** (len(configs.vae.block_out_channels) - 1)
        # model_index.json's flag (the pipeline's constructor default is True).
        self.force_zeros_for_empty_prompt = configs.pipeline.get("force_zeros_for_empty_prompt", True)
        size = configs.unet.sample_size * self.vae_scale_factor
        self.default_params = {**type(self).default_params, "height": size, "width": size}

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params  # defaults filled (prepare_request)
        check_divisible(params, height=self.vae_scale_factor, width=self.vae_scale_factor)

    # -- 2. encode: prompts, initial noise, timesteps ---------------------------------------

    def _encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(penultimate hidden states of both CLIPs side by side [N, 77, D1 + D2], CLIP-G's
        projected pooled output [N, P]) for N prompts (StableDiffusionXLPipeline.encode_prompt).
        No encoder gets an attention mask, so a prompt's embedding is the same in a batch as alone."""
        pairs = [(t, e) for t, e in ((self.tokenizer, self.text_encoder), (self.tokenizer_2, self.text_encoder_2))
                 if e is not None]
        hidden, pooled = [], None
        for tokenizer, text_encoder in pairs:
            ids = tokenizer(prompts, padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
                            return_tensors="pt").input_ids
            out = text_encoder(ids.to(self.device), output_hidden_states=True)
            hidden.append(out.hidden_states[-2])
            if out[0].ndim == 2:  # the encoder with a projection (CLIP-G) gives the pooled embedding
                pooled = out[0]
        return torch.cat(hidden, dim=-1).to(self.text_encoder_2.dtype), pooled

    def _encoded_negative(self, request: DiffusionRequest) -> bool:
        """Whether the request's uncond branch encodes a negative prompt (else zeros or no CFG)."""
        params = request.params
        return params.guidance_scale > 1 and not (params.negative_prompt is None and self.force_zeros_for_empty_prompt)

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # One call per text encoder over every prompt, then the negative prompts that are
        # encoded; CLIP's length is fixed (77), so all rows share it.
        embeds = encode_prompt_pairs(requests, uses_cfg=self._encoded_negative,
                                     encode=lambda texts: list(zip(*self._encode_prompts(texts))))
        return [self._initial_state(r, prompt, negative) for r, (prompt, negative) in zip(requests, embeds)]

    def _initial_state(self, request: DiffusionRequest, prompt: tuple[torch.Tensor, torch.Tensor],
                       negative: tuple[torch.Tensor, torch.Tensor] | None) -> DenoiseState:
        params = request.params
        n = params.num_outputs_per_prompt
        uses_cfg = params.guidance_scale > 1
        if uses_cfg and negative is None:  # force_zeros_for_empty_prompt
            negative = (torch.zeros_like(prompt[0]), torch.zeros_like(prompt[1]))

        noise_scheduler = self.noise_scheduler_copy()
        timesteps = self._timesteps(noise_scheduler, params)
        generator = self.generator_for(request)
        latents = self._start_latents(request, noise_scheduler, generator, prompt[0].dtype)

        time_ids, negative_time_ids = (torch.tensor([ids], device=self.device, dtype=prompt[0].dtype).expand(n, -1)
                                       for ids in self._time_ids(params))
        cond: dict[str, Any] = {
            "prompt_embeds": repeat_per_output(prompt[0], n),
            "pooled_prompt_embeds": repeat_per_output(prompt[1], n),
            "negative_prompt_embeds": repeat_per_output(negative[0], n) if uses_cfg else None,
            "negative_pooled_prompt_embeds": repeat_per_output(negative[1], n) if uses_cfg else None,
            "time_ids": time_ids,
            "negative_time_ids": negative_time_ids,
            "guidance_scale": params.guidance_scale,
            "guidance_rescale": params.extras["guidance_rescale"],
            "generator": generator,  # the noise scheduler's step noise comes next from it, as in diffusers
        }
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler, timesteps=timesteps,
                            cond=cond)

    def _timesteps(self, noise_scheduler: Any, params: Any) -> torch.Tensor:
        """The request's timesteps: the whole schedule, cut at `denoising_end` when given."""
        from diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl import retrieve_timesteps

        timesteps, _ = retrieve_timesteps(noise_scheduler, params.num_inference_steps, self.device)
        noise_scheduler.set_begin_index(0)
        end = params.extras.get("denoising_end")
        if end is not None and 0 < end < 1:
            timesteps = timesteps[timesteps >= timestep_cutoff(noise_scheduler, end)]
        return timesteps

    def _start_latents(self, request: DiffusionRequest, noise_scheduler: Any, generator: torch.Generator,
                       dtype: torch.dtype) -> torch.Tensor:
        """The noise the request starts from, scaled to the schedule's first sigma."""
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        shape = (params.num_outputs_per_prompt, self.unet.config.in_channels, params.height // self.vae_scale_factor,
                 params.width // self.vae_scale_factor)
        latents = randn_tensor(shape, generator=generator, device=self.device, dtype=dtype)
        return latents * noise_scheduler.init_noise_sigma  # after set_timesteps, as diffusers orders it

    def _time_ids(self, params: Any) -> tuple[list[float], list[float]]:
        """(cond, uncond) micro-conditioning: original size, crop top-left, target size (the
        requested size, uncropped) for both."""
        ids = [params.height, params.width, 0, 0, params.height, params.width]
        return ids, ids

    # -- 3. denoise -----------------------------------------------------------------------

    # CFG when guidance_scale > 1; both branches in one UNet call, as diffusers batches them.
    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative(), combine=rescaled_cfg, batch_branches=True)
    # No step caches: they hook a transformer's block chain, and SDXL denoises with a UNet.

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # One UNet call needs equal latent sizes (prompt lengths are CLIP's fixed 77).
        self.guided_steps(states, latent_shape, self._predict, self._noise_scheduler_step)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """One UNet call over every (state, branch) row; one prediction per row."""
        row_states = [s for s, _ in rows]
        prefixes = ["" if branch == "cond" else "negative_" for _, branch in rows]
        # Each state's noise scheduler scales its input by the state's current sigma.
        scaled = {id(s): s.noise_scheduler.scale_model_input(s.latents, s.timesteps[s.step_index]) for s in row_states}
        noise_pred = self.unet(
            torch.cat([scaled[id(s)] for s in row_states]),
            current_timesteps(row_states),
            encoder_hidden_states=torch.cat([s.cond[f"{p}prompt_embeds"] for s, p in zip(row_states, prefixes)]),
            added_cond_kwargs={
                "text_embeds": torch.cat([s.cond[f"{p}pooled_prompt_embeds"] for s, p in zip(row_states, prefixes)]),
                "time_ids": torch.cat([s.cond[f"{p}time_ids"] for s, p in zip(row_states, prefixes)]),
            },
            return_dict=False,
        )[0]
        return split_per_state(noise_pred, row_states)

    def _noise_scheduler_step(self, state: DenoiseState, noise_pred: torch.Tensor) -> None:
        """x_t -> x_t-1 with the state's noise scheduler, given the request's generator when it
        takes one (Euler's own step draws noise it only uses with s_churn > 0)."""
        kwargs = {"generator": state.cond["generator"]} if self._step_takes_generator else {}
        t = state.timesteps[state.step_index]
        state.latents = state.noise_scheduler.step(noise_pred, t, state.latents, return_dict=False, **kwargs)[0]
        state.step_index += 1

    # -- 4. decode ------------------------------------------------------------------------

    def decode(self, states: list[DenoiseState]) -> list[Any]:
        # As the ensemble's first stage (its input processor asks for it), the latents go on to the refiner.
        if all(s.request.condition.get("output") == "latents" for s in states):
            return [LatentPayload(latents=s.latents, extras={"denoising_end": s.request.params.extras.get(
                "denoising_end")}) for s in states]
        return super().decode(states)

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # States with the same latent size share one VAE call.
        return map_groups(states, latent_shape, self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        latents = torch.cat([s.latents for s in states])
        config = self.vae.config
        # A VAE with latent statistics (e.g. Playground v2.5) denormalises with them, as diffusers does.
        if getattr(config, "latents_mean", None) is not None and getattr(config, "latents_std", None) is not None:
            mean = torch.tensor(config.latents_mean).view(1, -1, 1, 1).to(latents.device, latents.dtype)
            std = torch.tensor(config.latents_std).view(1, -1, 1, 1).to(latents.device, latents.dtype)
            latents = latents * std / config.scaling_factor + mean
        else:
            latents = latents / config.scaling_factor
        images = self.vae_decode(latents.to(self.vae.dtype))
        return split_per_state(self.image_processor.postprocess(images, output_type="np"), states)

