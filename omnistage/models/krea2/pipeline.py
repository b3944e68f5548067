"""Krea 2: a Qwen3-VL text model whose hidden states at several layers are stacked per token,
a DiT that fuses them with the image tokens, Qwen-Image's causal-3D VAE, CFG.

Reproduces `diffusers.Krea2Pipeline` (pipelines/krea2/pipeline_krea2.py), split at the encode /
denoise_step / decode seams. CFG runs when `guidance_scale > 0` (diffusers' rule), on the
negative prompt ("" by default), each branch its own transformer call, extrapolating from the
cond prediction: cond + scale * (cond - uncond). Prompts are laid out at a fixed length,
`[system prefix | prompt | padding | assistant suffix]`, with positions that count only real
tokens, so a prompt's features are the same in a batch as alone.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.accel.step_cache import BlockChain
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, norm_clamped_cfg, scale_if_negative
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_divisible,
    current_timesteps,
    encode_prompts_by_length,
    grid_and_prompt_length,
    image_size,
    map_groups,
    pack_latents,
    repeat_per_output,
    split_per_state,
    unpack_latents,
)
from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, Accelerations

# Krea2Pipeline.__init__'s prompt layout (the Qwen-Image chat template), and its default taps
# (the Krea 2 Qwen3-VL-4B layers) for a checkpoint whose model_index.json names none.
PROMPT_PREFIX = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
                 "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n")
PROMPT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
PREFIX_TOKENS = 34
SUFFIX_TOKENS = 5
DEFAULT_SELECT_LAYERS = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)
DISTILLED_MU = 1.15
"""The timestep shift the few-step distilled checkpoint (model_index.json `is_distilled`) fixes."""


class Krea2(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "Krea2Pipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        step_caches=CACHE_BACKENDS, cfg_parallel=True, fsdp=True, vae_patch_parallel=True, vae_tiling=True, offload=True, quantization=True, lora=True, compile=True)
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->vae"
    # Krea2Pipeline.__call__ defaults (fixed sizes, not the checkpoint's).
    default_params: ClassVar[dict[str, Any]] = {
        "height": 1024,
        "width": 1024,
        "num_inference_steps": 28,
        "guidance_scale": 4.5,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, default=512, min=1, max=4096,
                                         help="Text tokens the DiT reads (the prompt is padded or cut to it)."),
    }

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.image_processor import VaeImageProcessor

        super().__init__(components, device, dtype, configs)
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.multiple_of)

    def configure(self, configs: CheckpointConfigs) -> None:
        pipeline = configs.pipeline
        self.select_layers = tuple(pipeline.get("text_encoder_select_layers") or DEFAULT_SELECT_LAYERS)
        self.is_distilled = bool(pipeline.get("is_distilled", False))
        self.patch_size = pipeline.get("patch_size", 2)
        # One VAE downsampling per temporal-downsample entry, then the patch packing.
        self.vae_scale_factor = 2 ** len(configs.vae.temperal_downsample)
        self.multiple_of = self.vae_scale_factor * self.patch_size

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        # diffusers warns and rounds up; we refuse, so the output has the size asked for.
        check_divisible(request.params, height=self.multiple_of, width=self.multiple_of)

    # -- 2. encode: prompts, initial noise, timesteps ---------------------------------------

    def _encode_prompts(self, prompts: list[str], max_sequence_length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(stacked hidden states [L, num_taps, D], real-token mask [L]) per prompt
        (Krea2Pipeline.get_text_hidden_states): the prefixed prompt padded to a fixed length, the
        suffix after the padding, positions counting real tokens only; the prefix dropped."""
        text = self.tokenizer([PROMPT_PREFIX + p for p in prompts], truncation=True, padding="max_length",
                              max_length=max_sequence_length + PREFIX_TOKENS - SUFFIX_TOKENS, return_tensors="pt")
        suffix = self.tokenizer([PROMPT_SUFFIX] * len(prompts), return_tensors="pt")
        input_ids = torch.cat([text.input_ids, suffix.input_ids], dim=1).to(self.device)
        mask = torch.cat([text.attention_mask, suffix.attention_mask], dim=1).bool().to(self.device)
        positions = (mask.long().cumsum(dim=-1) - 1).clamp(min=0).unsqueeze(0).expand(3, -1, -1)  # T/H/W alike
        out = self.text_encoder(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                                output_hidden_states=True)
        hidden = torch.stack([out.hidden_states[i] for i in self.select_layers], dim=2)[:, PREFIX_TOKENS:]
        return list(zip(hidden, mask[:, PREFIX_TOKENS:]))

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # Requests with the same max_sequence_length share one text-encoder call.
        embeds = encode_prompts_by_length(requests, uses_cfg=lambda r: r.params.guidance_scale > 0,
                                          encode=self._encode_prompts)
        return [self._initial_state(r, prompt, negative) for r, (prompt, negative) in zip(requests, embeds)]

    def _initial_state(self, request: DiffusionRequest, prompt: tuple[torch.Tensor, torch.Tensor],
                       negative: tuple[torch.Tensor, torch.Tensor] | None) -> DenoiseState:
        from diffusers import Krea2Pipeline
        from diffusers.pipelines.krea2.pipeline_krea2 import retrieve_timesteps
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        n = params.num_outputs_per_prompt
        embeds = prompt[0]
        latent_h, latent_w = params.height // self.vae_scale_factor, params.width // self.vae_scale_factor
        shape = (n, self.transformer.config.in_channels // self.patch_size ** 2, latent_h, latent_w)
        latents = pack_latents(randn_tensor(shape, generator=self.generator_for(request), device=self.device,
                                            dtype=embeds.dtype), self.patch_size)
        noise_scheduler = self.noise_scheduler_copy()
        num_steps = params.num_inference_steps
        timesteps, _ = retrieve_timesteps(noise_scheduler, num_steps, self.device,
                                          sigmas=np.linspace(1.0, 1 / num_steps, num_steps),
                                          mu=self._timestep_shift(noise_scheduler.config, latents.shape[1]))
        noise_scheduler.set_begin_index(0)

        negative_embeds, negative_mask = negative if negative is not None else (None, None)
        grid = (latent_h // self.patch_size, latent_w // self.patch_size)
        cond = {
            "prompt_embeds": repeat_per_output(embeds, n), "prompt_mask": repeat_per_output(prompt[1], n),
            "negative_prompt_embeds": repeat_per_output(negative_embeds, n),
            "negative_prompt_mask": repeat_per_output(negative_mask, n),
            # Text tokens at the origin, image tokens at (0, row, col) of the patch grid.
            "position_ids": Krea2Pipeline.prepare_position_ids(embeds.shape[0], *grid, self.device),
            "guidance_scale": params.guidance_scale,
            "cfg_normalization": 0.0,  # norm_clamped_cfg without its cap is Krea 2's rule
        }
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler, timesteps=timesteps,
                            cond=cond)

    def _timestep_shift(self, config: Any, image_seq_len: int) -> float:
        """mu: fixed for a distilled checkpoint, else by resolution with Krea 2's own fallbacks
        (a longest sequence of 6400, not FLUX's 4096) for what the scheduler config leaves out."""
        from diffusers.pipelines.krea2.pipeline_krea2 import calculate_shift

        if self.is_distilled:
            return DISTILLED_MU
        return calculate_shift(image_seq_len, config.get("base_image_seq_len", 256),
                               config.get("max_image_seq_len", 6400), config.get("base_shift", 0.5),
                               config.get("max_shift", 1.15))

    # -- 3. denoise -----------------------------------------------------------------------

    # CFG when guidance_scale > 0: cond + scale * (cond - uncond), each branch its own call.
    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative(), combine=norm_clamped_cfg)
    # Step caches wrap the DiT blocks over the joined [text; image] sequence (hidden states
    # first, returned). TeaCache compares the first block's normed input, shifted and scaled by
    # its share of the timestep modulation; no coefficients are published for Krea 2: no rescaling.
    step_cache_blocks: ClassVar[BlockChain] = BlockChain(
        blocks=("transformer_blocks",),
        io="single_stream",
        modulated_input=lambda block, args, kwargs: krea2_modulated_input(block, args),
    )

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # The position ids are shared across a transformer call: equal grids and text lengths.
        self.guided_steps(states, grid_and_prompt_length, self._predict)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """The transformer's prediction for one branch's rows, one per state."""
        states = [s for s, _ in rows]
        prefix = "" if rows[0][1] == "cond" else "negative_"
        latents = torch.cat([s.latents for s in states])
        timestep = current_timesteps(states) / self.noise_scheduler.config.num_train_timesteps
        pred = self.transformer(
            hidden_states=latents,
            encoder_hidden_states=torch.cat([s.cond[f"{prefix}prompt_embeds"] for s in states]),
            timestep=timestep.to(latents.dtype),
            position_ids=states[0].cond["position_ids"],
            encoder_attention_mask=torch.cat([s.cond[f"{prefix}prompt_mask"] for s in states]),
            return_dict=False,
        )[0]
        return split_per_state(pred, states)

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # States with the same image size share one VAE call.
        return map_groups(states, image_size, self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        params = states[0].request.params
        h, w = params.height // self.vae_scale_factor, params.width // self.vae_scale_factor
        # [B, C, 1, H, W]: one frame for the video VAE.
        latents = unpack_latents(torch.cat([s.latents for s in states]), h, w, self.patch_size)
        latents = latents.unsqueeze(2).to(self.vae.dtype)
        config = self.vae.config
        mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1).to(latents.device, latents.dtype)
        # diffusers divides by the reciprocal std: kept, so the float rounding matches.
        inv_std = 1.0 / torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1).to(latents.device,
                                                                                          latents.dtype)
        images = self.vae_decode(latents / inv_std + mean)[:, :, 0]
        return split_per_state(self.image_processor.postprocess(images, output_type="np"), states)


def krea2_modulated_input(block: Any, args: tuple) -> torch.Tensor:
    """TeaCache's input: the first block's normed tokens, pre-scaled and shifted as its attention
    sees them (Krea2TransformerBlock: the shared timestep modulation plus the block's table)."""
    hidden_states, temb = args[0], args[1]
    prescale, preshift = (temb.unflatten(-1, (6, -1)) + block.scale_shift_table).unbind(-2)[:2]
    return (1.0 + prescale) * block.norm1(hidden_states) + preshift
