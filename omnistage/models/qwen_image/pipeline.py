"""Qwen-Image: a Qwen2.5-VL text encoder, an MMDiT on 2x2-packed latents and a causal-3D VAE.

Reproduces `diffusers.QwenImagePipeline` (pipelines/qwenimage/pipeline_qwenimage.py),
split at the encode / denoise_step / decode seams. `QwenImageEdit` (edit_pipeline.py)
subclasses it and overrides only the hooks that differ: the prompt template, the text
inputs (the encoder also sees the input image), the condition image and its latents;
`QwenImageEditPlus` (edit_plus_pipeline.py) takes 1-3 input images on top of that,
`QwenImageLayered` (layered_pipeline.py) decomposes an RGBA image into RGBA layers, and
`QwenImage21` (v21_pipeline.py) keeps the encode seams with its own encoder, latents and
transformer call.

True CFG runs as in diffusers: a second transformer pass on the negative prompt, only
when `true_cfg_scale > 1` and a negative prompt was given, combined with a rescale that
keeps each token's prediction norm equal to the cond prediction's (`guidance`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.accel.step_cache import BlockChain
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, rescaled_true_cfg, scale_if_negative
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_divisible,
    current_timesteps,
    latent_grid,
    map_groups,
    pack_latents,
    set_flow_match_timesteps,
    split_per_state,
    unpack_latents,
)
from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, Accelerations
from omnistage.models.qwen_image.parallel import SEQUENCE_PLAN, TENSOR_PLAN


class QwenImage(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "QwenImagePipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        step_caches=CACHE_BACKENDS, cfg_parallel=True, sequence_parallel=SEQUENCE_PLAN, tensor_parallel=TENSOR_PLAN,
        fsdp=True, vae_patch_parallel=True, vae_tiling=True, offload=True, quantization=True, lora=True, compile=True)
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->vae"
    _optional_components: ClassVar[list[str]] = []
    # QwenImagePipeline.__call__ defaults; height/width (default_sample_size * VAE factor)
    # depend on the checkpoint and are added per instance in __init__.
    default_params: ClassVar[dict[str, Any]] = {
        "num_inference_steps": 50,
        "true_cfg_scale": 4.0,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, default=512, min=1, max=1024,
                                         max_from=("tokenizer", "text_encoder"), help="Prompt tokens kept."),
    }

    # QwenImagePipeline's prompt template; the encoder's hidden states of the first
    # `prompt_template_start_idx` tokens (the system prompt) are dropped.
    prompt_template: ClassVar[str] = (
        "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
        "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    prompt_template_start_idx: ClassVar[int] = 34
    tokenizer_max_length: ClassVar[int] = 1024
    default_sample_size: ClassVar[int] = 128  # latent pixels; times the VAE factor = 1024

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.image_processor import VaeImageProcessor

        super().__init__(components, device, dtype, configs)
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.multiple_of)

    def configure(self, configs: CheckpointConfigs) -> None:
        self.vae_scale_factor = 2 ** len(configs.vae.temperal_downsample)
        # Latents are packed in 2x2 patches, so pixel sizes must divide by twice the VAE factor.
        self.multiple_of = self.vae_scale_factor * 2
        self.latent_channels = configs.vae.z_dim
        self.guidance_embeds = bool(configs.transformer.get("guidance_embeds", False))
        self.default_params = self._checkpoint_defaults()

    def _checkpoint_defaults(self) -> dict[str, Any]:
        side = self.default_sample_size * self.vae_scale_factor
        return {**type(self).default_params, "height": side, "width": side}

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params
        check_divisible(params, height=self.multiple_of, width=self.multiple_of)
        if self.guidance_embeds and params.guidance_scale is None:
            raise RequestError("guidance_scale", "guidance_scale is required: this model is guidance-distilled")
        if not self.guidance_embeds and params.guidance_scale is not None:
            raise RequestError("guidance_scale", "guidance_scale: this model is not guidance-distilled; use true_cfg_scale "
                               "with a negative_prompt for classifier-free guidance")

    # -- 2. encode: prompts, initial noise, timesteps ---------------------------------------

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        images = [self._condition_image(r) for r in requests]
        embeds = self._encode_requests(requests, images)
        return [self._initial_state(r, image, *e) for r, image, e in zip(requests, images, embeds)]

    def _condition_image(self, request: DiffusionRequest) -> Any:
        """The input image as the model sees it (edit models); None for text-to-image."""
        return None

    @staticmethod
    def _uses_cfg(request: DiffusionRequest) -> bool:
        # As in diffusers: the default true_cfg_scale (4.0) only takes effect with a negative prompt.
        return request.params.true_cfg_scale > 1 and request.params.negative_prompt is not None

    def _encode_requests(self, requests: list[DiffusionRequest],
                         images: list[Any]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """(prompt embeds, negative prompt embeds or None) per request, all prompts in one
        text-encoder call. Each embedding is [num_tokens, dim] without padding."""
        guided = [i for i, r in enumerate(requests) if self._uses_cfg(r)]
        texts = [r.prompt for r in requests] + [requests[i].params.negative_prompt for i in guided]
        embeds = self._encode_prompts(texts, images + [images[i] for i in guided])
        negatives = dict(zip(guided, embeds[len(requests):]))
        return [(e, negatives.get(i)) for i, e in enumerate(embeds[: len(requests)])]

    def _encode_prompts(self, prompts: list[str], images: list[Any]) -> list[torch.Tensor]:
        """The last hidden state of each templated prompt, its padding and system prompt dropped
        (QwenImagePipeline._get_qwen_prompt_embeds)."""
        images = images or [None] * len(prompts)  # text-to-image callers may pass no images
        inputs = self._text_inputs([self._templated(p, image) for p, image in zip(prompts, images)], images)
        hidden = self._encoder_hidden_states(inputs)
        masks = inputs["attention_mask"].bool()
        return [h[m][self.prompt_template_start_idx:] for h, m in zip(hidden, masks)]

    def _encoder_hidden_states(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The text encoder's last hidden state for `_text_inputs`' output."""
        return self.text_encoder(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            pixel_values=inputs.get("pixel_values"),
            image_grid_thw=inputs.get("image_grid_thw"),
            output_hidden_states=True,
        ).hidden_states[-1]

    def _templated(self, prompt: str, image: Any) -> str:
        """The text the encoder reads for `prompt` (and its condition image, edit models)."""
        return self.prompt_template.format(prompt)

    def _text_inputs(self, texts: list[str], images: list[Any]) -> dict[str, torch.Tensor]:
        # Right padding: a prompt's tokens see the same positions in a batch as alone.
        return self.tokenizer(texts, max_length=self.tokenizer_max_length + self.prompt_template_start_idx,
                              padding=True, truncation=True, return_tensors="pt").to(self.device)

    def _truncate(self, embeds: torch.Tensor, request: DiffusionRequest) -> torch.Tensor:
        return embeds[: request.params.extras["max_sequence_length"]]

    def _prompt_cond(self, request: DiffusionRequest, prompt_embeds: torch.Tensor,
                     negative_embeds: torch.Tensor | None) -> dict[str, Any]:
        """A state's prompt conditions: the embeddings cut to max_sequence_length, the CFG scales."""
        return {
            "prompt_embeds": self._truncate(prompt_embeds, request),
            "negative_prompt_embeds": None if negative_embeds is None else self._truncate(negative_embeds, request),
            "true_cfg_scale": request.params.true_cfg_scale,
            "guidance_scale": request.params.guidance_scale,  # None unless the model is guidance-distilled
        }

    def _initial_state(self, request: DiffusionRequest, image: Any, prompt_embeds: torch.Tensor,
                       negative_embeds: torch.Tensor | None) -> DenoiseState:
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        dtype = prompt_embeds.dtype
        latent_h, latent_w = latent_grid(params, self.multiple_of)
        # Same draw as diffusers' [n, 1 frame, C, h, w] noise, packed to [n, h/2 * w/2, 4C].
        shape = (params.num_outputs_per_prompt, self.transformer.config.in_channels // 4, latent_h, latent_w)
        noise = randn_tensor(shape, generator=self.generator_for(request), device=self.device, dtype=dtype)
        latents = pack_latents(noise)

        num_steps = params.num_inference_steps
        noise_scheduler = self.noise_scheduler_copy()
        sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
        timesteps = set_flow_match_timesteps(noise_scheduler, sigmas, latents.shape[1], self.device)
        return DenoiseState(
            request=request,
            latents=latents,
            noise_scheduler=noise_scheduler,
            timesteps=timesteps,
            cond={
                **self._prompt_cond(request, prompt_embeds, negative_embeds),
                "latent_size": (latent_h, latent_w),
                # (frames, rows, cols) of each token grid the transformer sees, for RoPE.
                "img_shapes": ((1, latent_h // 2, latent_w // 2),),
            },
        )

    # -- 3. denoise -----------------------------------------------------------------------

    # True CFG: a second pass on the negative prompt when the request has one, rescaled to
    # the cond prediction's norm; each branch its own call, as in diffusers.
    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative("true_cfg_scale"), combine=rescaled_true_cfg)

    # Step caches wrap the dual-stream blocks. TeaCache's coefficients for Qwen-Image are the
    # ones vLLM-Omni ships (diffusion/cache/teacache/config.py), which credits ComfyUI-TeaCache.
    step_cache_blocks: ClassVar[BlockChain] = BlockChain(
        blocks=("transformer_blocks",),
        io="dual_stream",
        modulated_input=lambda block, args, kwargs: qwen_image_modulated_input(block, kwargs),
        tea_cache_coefficients=(-4.5e02, 2.8e02, -4.5e01, 3.2e00, -2.0e-02),
        split_tokens=("image tokens",),
    )

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # One transformer call per token-grid layout (RoPE is computed for the batch's first).
        self.guided_steps(states, lambda s: s.cond["img_shapes"], self._predict)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """One batched transformer pass over one branch's rows; each state's noise prediction."""
        states = [s for s, _ in rows]
        branch = rows[0][1]
        embeds_key = "prompt_embeds" if branch == "cond" else "negative_prompt_embeds"
        latents = torch.cat([s.latents for s in states])
        hidden_states = torch.cat([self._model_input(s) for s in states])
        embeds, mask = self._pad_embeds([s.cond[embeds_key] for s in states for _ in range(s.latents.shape[0])])
        guidance = None
        if self.guidance_embeds:
            guidance = torch.cat([torch.full((s.latents.shape[0],), s.cond["guidance_scale"], device=self.device,
                                             dtype=torch.float32) for s in states])
        with self.transformer.cache_context(branch):
            noise_pred = self.transformer(
                hidden_states=hidden_states,
                timestep=current_timesteps(states).to(latents.dtype) / 1000,
                guidance=guidance,
                encoder_hidden_states=embeds,
                encoder_hidden_states_mask=mask,
                img_shapes=[list(states[0].cond["img_shapes"])] * latents.shape[0],
                **self._transformer_options(latents.shape[0]),
                return_dict=False,
            )[0]
        # Edit models also predict the condition-image tokens appended after the target's.
        return split_per_state(noise_pred[:, : latents.shape[1]], states)

    def _model_input(self, state: DenoiseState) -> torch.Tensor:
        """The transformer's image tokens for `state`: its latents (edit: plus the input image's)."""
        return state.latents

    def _transformer_options(self, batch_size: int) -> dict[str, Any]:
        """More transformer inputs for a call over `batch_size` latents (Layered: its extra timestep condition)."""
        return {}

    @staticmethod
    def _pad_embeds(embeds: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Right-pad prompt embeddings to one length; the mask marks real tokens. No mask when
        nothing was padded, as diffusers passes none for a single unpadded prompt."""
        max_len = max(e.shape[0] for e in embeds)
        padded = torch.stack([torch.cat([e, e.new_zeros(max_len - e.shape[0], e.shape[1])]) for e in embeds])
        if all(e.shape[0] == max_len for e in embeds):
            return padded, None
        mask = torch.stack([torch.arange(max_len, device=e.device) < e.shape[0] for e in embeds]).long()
        return padded, mask

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        return map_groups(states, lambda s: s.cond["latent_size"], self._decode_group)  # one VAE call per size

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        latent_h, latent_w = states[0].cond["latent_size"]
        latents = unpack_latents(torch.cat([s.latents for s in states]), latent_h, latent_w)
        latents = latents.unsqueeze(2).to(self.vae.dtype)  # [B, C, 1 frame, h, w]
        mean, std = self._latents_stats(latents)
        images = self.vae_decode(latents * std + mean)[:, :, 0]
        return split_per_state(self.image_processor.postprocess(images, output_type="np"), states)

    def _latents_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The checkpoint's per-channel latent mean and std, shaped [1, C, 1, 1, 1] like `like`."""
        shape = (1, self.latent_channels, 1, 1, 1)
        mean = torch.tensor(self.vae.config.latents_mean).view(shape).to(like.device, like.dtype)
        std = torch.tensor(self.vae.config.latents_std).view(shape).to(like.device, like.dtype)
        return mean, std


def qwen_image_modulated_input(block: Any, kwargs: dict) -> torch.Tensor:
    """TeaCache's input: the first block's normed image tokens, shifted and scaled by its
    timestep modulation (QwenImageTransformerBlock's img_norm1 + img_mod1). Edit models with a
    zero-timestep condition image (zero_cond_t) give twice the rows of temb: the first are t's."""
    hidden = kwargs["hidden_states"]
    mod = block.img_mod(kwargs["temb"])[: hidden.shape[0]]
    shift, scale, _ = mod.chunk(2, dim=-1)[0].chunk(3, dim=-1)
    return block.img_norm1(hidden) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)
