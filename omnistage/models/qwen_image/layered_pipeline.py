"""Qwen-Image-Layered: an RGBA image and its caption -> the image's RGBA layers.

Reproduces `diffusers.QwenImageLayeredPipeline` (pipelines/qwenimage/pipeline_qwenimage_layered.py)
on top of `QwenImage`: the prompt is encoded as Qwen-Image's; the input image, resized to the
output size, is VAE-encoded as RGBA (the distribution's mode) and appended after the noisy
latents, which hold `layers + 1` frames of the output size (the first is the composite, which
is not returned). The transformer rotates positions per layer (its layer-3D RoPE reads the
frames from `img_shapes`) and takes an extra timestep condition (0: RGBA). True CFG is plain,
or rescaled to the cond prediction's norm with `cfg_normalize`. The timestep shift `mu` comes
from the input image's token count, not the scheduler's resolution rule.

Output: one request gives `layers` RGBA images per output, in order (output 0's layers, then
output 1's): an ImagePayload's `images`, and one `data` item each from /v1/images/edits.

Output size: diffusers takes none; it generates `resolution`**2 pixels (640 or 1024) at the
input image's aspect ratio, which is our default. A size asked for (`height`/`width`, the edit
route's `size`) resizes the input image to it, where diffusers would use its own.
Not run: captioning the image with the VLM when the prompt is empty (diffusers' `use_en_prompt`);
a prompt is required.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.guidance import Guidance, plain_cfg, rescaled_true_cfg, scale_if_negative
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import DenoiseState, latent_grid, map_groups, pack_latents, unpack_latents
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.qwen_image.pipeline import QwenImage

# QwenImageLayeredPipeline.__call__'s shift: mu = sqrt(input-image tokens / BASE_TOKENS).
BASE_TOKENS = 256 * 256 / 16 / 16


def layered_cfg(state: DenoiseState, cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Plain true CFG; with `cfg_normalize`, rescaled to the cond prediction's per-token norm."""
    combine = rescaled_true_cfg if state.cond["cfg_normalize"] else plain_cfg
    return combine(state, cond, uncond, scale)


class QwenImageLayered(QwenImage):
    reference_class: ClassVar[str] = "QwenImageLayeredPipeline"
    needs_image: ClassVar[bool] = True
    # QwenImageLayeredPipeline.__call__ defaults; height/width follow the input image (prepare_request).
    default_params: ClassVar[dict[str, Any]] = {"num_inference_steps": 50, "true_cfg_scale": 4.0}
    extras: ClassVar[dict[str, ExtraSpec]] = {
        **QwenImage.extras,
        "layers": ExtraSpec(int, default=4, min=1, help="RGBA layers to decompose the image into."),
        "resolution": ExtraSpec(int, default=640, choices=(640, 1024),
                                help="The output's area bucket (its side squared) when no size is asked for."),
        "cfg_normalize": ExtraSpec(bool, default=False,
                                   help="Rescale the guided prediction to the cond prediction's norm."),
    }
    # The checkpoint's `processor` (a Qwen2VLProcessor, which transformers cannot build without
    # torchvision) serves only the captioning that is not run: never loaded.
    loader_overrides: ClassVar[dict[str, Any]] = {"processor": None}

    def _checkpoint_defaults(self) -> dict[str, Any]:
        return dict(type(self).default_params)

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        if len(request.images) > 1:
            raise RequestError("image", f"image: this model decomposes one input image, got {len(request.images)}")
        if not request.prompt.strip():
            raise RequestError("prompt", "prompt: a caption of the image is required (diffusers captions an empty "
                                         "prompt with its VLM, which is not run here)")

    def prepare_request(self, request: DiffusionRequest) -> DiffusionRequest:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_layered import calculate_dimensions

        request = super().prepare_request(request)
        params = request.params
        if params.height is None or params.width is None:
            width, height = request.images[0].size
            side = params.extras["resolution"]
            width, height = calculate_dimensions(side * side, width / height)
            # As diffusers: rounded down to what the 2x2 packing allows.
            size = {"height": params.height or height // self.multiple_of * self.multiple_of,
                    "width": params.width or width // self.multiple_of * self.multiple_of}
            request = dataclasses.replace(request, params=params.model_copy(update=size))
        return request

    # -- 2. encode: the prompt as Qwen-Image's; the input image joins the latents -----------

    def _condition_image(self, request: DiffusionRequest) -> Any:
        """The input image as RGBA (an RGB one opaque) at the output size; the text encoder
        does not see it (Qwen-Image's prompt encoding)."""
        params = request.params
        return self.image_processor.resize(request.images[0].convert("RGBA"), params.height, params.width)

    def _initial_state(self, request: DiffusionRequest, image: Any, prompt_embeds: torch.Tensor,
                       negative_embeds: torch.Tensor | None) -> DenoiseState:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_layered import retrieve_timesteps
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        dtype = prompt_embeds.dtype
        n, frames = params.num_outputs_per_prompt, params.extras["layers"] + 1
        latent_h, latent_w = latent_grid(params, self.multiple_of)
        channels = self.transformer.config.in_channels // 4
        # diffusers' [n, frames, C, h, w] draw, each frame packed to 2x2 tokens, frame after frame.
        noise = randn_tensor((n, frames, channels, latent_h, latent_w), generator=self.generator_for(request),
                             device=self.device, dtype=dtype)
        latents = pack_latents(noise.flatten(0, 1)).reshape(n, -1, channels * 4)

        pixels = self.image_processor.preprocess(image, params.height, params.width).unsqueeze(2)
        image_latents = self.vae_encode(pixels.to(self.device, dtype)).latent_dist.mode()
        mean, std = self._latents_stats(image_latents)
        image_latents = pack_latents(((image_latents - mean) / std)[:, :, 0])

        noise_scheduler = self.noise_scheduler_copy()
        num_steps = params.num_inference_steps
        timesteps, _ = retrieve_timesteps(noise_scheduler, num_steps, self.device,
                                          sigmas=np.linspace(1.0, 0, num_steps + 1)[:-1],
                                          mu=(image_latents.shape[1] / BASE_TOKENS) ** 0.5)
        noise_scheduler.set_begin_index(0)
        grid = (1, latent_h // 2, latent_w // 2)
        return DenoiseState(
            request=request,
            latents=latents,
            noise_scheduler=noise_scheduler,
            timesteps=timesteps,
            cond={
                **self._prompt_cond(request, prompt_embeds, negative_embeds),
                "cfg_normalize": params.extras["cfg_normalize"],
                "image_latents": image_latents.expand(n, -1, -1),
                "latent_size": (latent_h, latent_w),
                "frames": frames,
                # Every frame's grid, then the input image's (the same size).
                "img_shapes": (grid,) * frames + (grid,),
            },
        )

    # -- 3. denoise: Qwen-Image's, over the layers and the input image's tokens ----------------

    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative("true_cfg_scale"), combine=layered_cfg)

    def _model_input(self, state: DenoiseState) -> torch.Tensor:
        return torch.cat([state.latents, state.cond["image_latents"]], dim=1)

    def _transformer_options(self, batch_size: int) -> dict[str, Any]:
        # The extra timestep condition is 0 for RGBA output (diffusers' is_rgb, always 0).
        return {"additional_t_cond": torch.zeros(batch_size, dtype=torch.long, device=self.device)}

    # -- 4. decode: every frame but the composite -------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # One VAE call per size and layer count; each state's [outputs * layers, H, W, 4].
        return map_groups(states, lambda s: (s.cond["latent_size"], s.cond["frames"]), self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        (latent_h, latent_w), frames = states[0].cond["latent_size"], states[0].cond["frames"]
        latents = torch.cat([s.latents for s in states])
        batch, _, packed = latents.shape
        latents = unpack_latents(latents.reshape(batch * frames, -1, packed), latent_h, latent_w)
        layers = latents.unflatten(0, (batch, frames))[:, 1:].flatten(0, 1)  # the composite frame dropped
        layers = layers.unsqueeze(2).to(self.vae.dtype)  # [B * layers, C, 1 frame, h, w]
        mean, std = self._latents_stats(layers)
        images = self.image_processor.postprocess(self.vae_decode(layers * std + mean)[:, :, 0], output_type="np")
        counts = [s.latents.shape[0] * (frames - 1) for s in states]
        return list(np.split(images, np.cumsum(counts)[:-1]))
