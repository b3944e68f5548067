"""JoyAI-Image-Edit: a Qwen3-VL encoder reads the input image and the instruction, a
double-stream 3-D DiT denoises the target's latents next to the input image's (two "items" of
one sequence), the Wan 2.1 VAE encodes and decodes.

Reproduces `diffusers.JoyImageEditPipeline` (pipelines/joyimage/pipeline_joyimage_edit.py) for
editing, split at the encode / denoise_step / decode seams:

- the input image is resized to cover the output size and center-cropped to it; the encoder
  reads it at its processor's size inside a chat prompt, before the instruction; the prompt's
  embeddings are the last decoder layer's output before the final norm, the first
  SYSTEM_TOKENS (the system turn) dropped;
- its VAE latents (normalized by the VAE's latent statistics) are the first item, restored
  each step in diffusers (here simply never stepped), the noise the second; the transformer
  predicts both and the target's is kept;
- CFG runs when `guidance_scale > 1` on the negative prompt ("" by default), read with the
  same image, each branch its own call; the guided prediction is rescaled to the cond
  prediction's norm over the latent channels.

The transformer takes no text mask, so prompts of different token lengths never share a call
(padding would change them): a prompt gives what it gives alone, as in diffusers' single call.

Differences from diffusers, both for reproducibility and size control:
- the input image's latents are sampled from the request's generator (after the initial
  noise); diffusers samples them from the global RNG, which no seed reaches;
- output size: diffusers snaps it (asked or not) to the ~1-megapixel bucket nearest its aspect
  ratio; here the bucket nearest the input image's aspect ratio is the default, and a size
  asked for (`height`/`width`, the edit route's `size`) is used as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.accel.declaration import Accelerations
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg, scale_if_negative
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_divisible,
    current_timesteps,
    group_by,
    map_groups,
    split_per_state,
)
from omnistage.models.qwen_image.vl_processor import prenorm_last_hidden_states

# JoyImageEditPipeline's "multiple_images" prompt template around one image and the instruction.
PROMPT_TEMPLATE = (
    "<|im_start|>system\n \\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n<|im_start|>assistant\n"
)
SYSTEM_TOKENS = 34  # diffusers' prompt_template_encode_start_idx: the system turn, dropped
MAX_TEXT_TOKENS = 4096  # diffusers' max_sequence_length: longer prompts keep their last tokens
BUCKET_BASE = 1024  # the output-size buckets' base side (JoyImageEditImageProcessor's basesize)


def channel_rescaled_cfg(state: DenoiseState, cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Plain CFG, then each latent pixel's prediction rescaled to the cond prediction's norm
    over the channels ([n, C, T, H, W] predictions), as diffusers does."""
    guided = plain_cfg(state, cond, uncond, scale)
    cond_norm = torch.norm(cond, dim=1, keepdim=True)
    guided_norm = torch.norm(guided, dim=1, keepdim=True)
    return guided * (cond_norm / guided_norm.clamp_min(1e-6))


class JoyImageEdit(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "JoyImageEditPipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        cfg_parallel=True, vae_tiling=True, offload=True, quantization=True, compile=True,
        refused={"cache_backend": "no step-cache chain is written for its double-stream blocks yet",
                 "lora": "diffusers' JoyImageEditPipeline has no LoRA loader",
                 "ulysses_degree": "its transformer has no sequence-parallel plan"})
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->vae"
    needs_image: ClassVar[bool] = True
    # JoyImageEditPipeline.__call__ defaults; height/width follow the input image (prepare_request).
    default_params: ClassVar[dict[str, Any]] = {"num_inference_steps": 40, "guidance_scale": 4.0}

    @classmethod
    def loader_kwargs(cls, path: str) -> dict[str, Any]:
        # The checkpoint's processor is a Qwen3VLProcessor, which transformers only builds with
        # torchvision installed: built from its tokenizer and image halves.
        from transformers import Qwen3VLProcessor

        from omnistage.models.qwen_image.vl_processor import processor_from_parts

        return {"processor": processor_from_parts(Qwen3VLProcessor, path)}

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.image_processor import VaeImageProcessor
        from diffusers.pipelines.joyimage.image_processor import JoyImageEditImageProcessor

        super().__init__(components, device, dtype, configs)
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.vae_scale_factor)
        self.edit_image_processor = JoyImageEditImageProcessor(vae_scale_factor=self.vae_scale_factor)

    def configure(self, configs: CheckpointConfigs) -> None:
        self.vae_scale_factor = configs.vae.get("scale_factor_spatial") or 8
        # The transformer cuts latents into 2x2 patches: sizes divide by twice the VAE factor.
        self.multiple_of = self.vae_scale_factor * 2

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        if len(request.images) > 1:
            raise RequestError("image", f"image: this model edits one input image, got {len(request.images)}")
        check_divisible(request.params, height=self.multiple_of, width=self.multiple_of)

    def prepare_request(self, request: DiffusionRequest) -> DiffusionRequest:
        from diffusers.pipelines.joyimage.image_processor import find_best_bucket

        request = super().prepare_request(request)
        params = request.params
        if params.height is None or params.width is None:
            width, height = request.images[0].size
            height, width = find_best_bucket(height, width, BUCKET_BASE)
            size = {"height": params.height or height, "width": params.width or width}
            request = dataclasses.replace(request, params=params.model_copy(update=size))
            self.check_inputs(request)  # the filled size must divide too
        return request

    # -- 2. encode: the image and the prompt for the encoder, latents for the transformer --

    def _prompt_embeds(self, prompt: str, image: Any) -> torch.Tensor:
        """[L, D]: `prompt` read with `image` by the encoder, the system turn dropped."""
        inputs = self.processor(text=[PROMPT_TEMPLATE.format(prompt)], images=[image], padding=True,
                                return_tensors="pt").to(self.device)
        return prenorm_last_hidden_states(self.text_encoder, dict(inputs))[0, SYSTEM_TOKENS:][-MAX_TEXT_TOKENS:]

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        states = []
        for request in requests:
            params = request.params
            image = self.edit_image_processor.resize_center_crop(request.images[0].convert("RGB"),
                                                                 (params.height, params.width))
            prompt = self._prompt_embeds(request.prompt, image)
            guided = params.guidance_scale > 1
            negative = self._prompt_embeds(params.negative_prompt or "", image) if guided else None
            states.append(self._initial_state(request, image, prompt, negative))
        return states

    def _initial_state(self, request: DiffusionRequest, image: Any, prompt: torch.Tensor,
                       negative: torch.Tensor | None) -> DenoiseState:
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        n = params.num_outputs_per_prompt
        generator = self.generator_for(request)
        shape = (n, 1, self.transformer.config.in_channels, 1,
                 params.height // self.vae_scale_factor, params.width // self.vae_scale_factor)
        # diffusers' [n, item, C, T, H, W] noise draw; the item axis is the target alone here.
        latents = randn_tensor(shape, generator=generator, device=self.device, dtype=prompt.dtype)[:, 0]
        pixels = torch.from_numpy(np.array(image)).to(self.device, prompt.dtype) / 127.5 - 1.0
        pixels = pixels.permute(2, 0, 1)[None, :, None]  # [1, 3, 1 frame, H, W]
        image_latents = self.vae.encode(pixels.to(self.vae.dtype)).latent_dist.sample(generator)
        mean, std = self._latents_stats(image_latents)
        image_latents = ((image_latents - mean) / std).to(prompt.dtype)

        noise_scheduler = self.noise_scheduler_copy()
        noise_scheduler.set_timesteps(params.num_inference_steps, device=self.device)
        noise_scheduler.set_begin_index(0)

        def repeat(embeds: torch.Tensor | None) -> torch.Tensor | None:
            return None if embeds is None else embeds.unsqueeze(0).expand(n, *embeds.shape)

        cond = {"prompt_embeds": repeat(prompt), "negative_prompt_embeds": repeat(negative),
                "image_latents": image_latents.expand(n, *image_latents.shape[1:]),
                "guidance_scale": params.guidance_scale}
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler,
                            timesteps=noise_scheduler.timesteps, cond=cond)

    def _latents_stats(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's per-channel latent mean and std, shaped to broadcast over [n, C, T, H, W]."""
        config = self.vae.config
        view = lambda values: torch.tensor(values).view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)  # noqa: E731
        return view(config.latents_mean), view(config.latents_std)

    # -- 3. denoise -----------------------------------------------------------------------

    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative(), combine=channel_rescaled_cfg)

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        for state, pred in zip(states, self.guided_predictions(states, self._predict)):
            self.noise_scheduler_step(state, pred)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """One branch's predictions: one transformer call per prompt length and image size."""
        key = "prompt_embeds" if rows[0][1] == "cond" else "negative_prompt_embeds"
        states = [s for s, _ in rows]
        preds: dict[int, torch.Tensor] = {}
        for group in group_by(states, lambda s: (s.cond[key].shape[1], *s.latents.shape[-2:])):
            preds.update(zip(map(id, group), self._predict_group(group, key)))
        return [preds[id(s)] for s in states]

    def _predict_group(self, states: list[DenoiseState], key: str) -> list[torch.Tensor]:
        latents = torch.cat([s.latents for s in states])
        # Two items per sample: the input image's latents first, the target's last.
        items = torch.stack([torch.cat([s.cond["image_latents"] for s in states]), latents], dim=1)
        pred = self.transformer(hidden_states=items, timestep=current_timesteps(states).to(latents.dtype),
                                encoder_hidden_states=torch.cat([s.cond[key] for s in states]), return_dict=False)[0]
        return split_per_state(pred[:, -1], states)

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # States with the same image size share one VAE call.
        return map_groups(states, lambda s: tuple(s.latents.shape[-2:]), self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        latents = torch.cat([s.latents for s in states]).to(self.vae.dtype)
        mean, std = self._latents_stats(latents)
        images = self.vae_decode(latents * std + mean)[:, :, 0]
        return split_per_state(self.image_processor.postprocess(images.float(), output_type="np"), states)
