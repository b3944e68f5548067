"""Qwen-Image-Edit: Qwen-Image conditioned on input images, which the model sees twice.

Reproduces `diffusers.QwenImageEditPipeline` (pipelines/qwenimage/pipeline_qwenimage_edit.py)
on top of `QwenImage`: the text encoder reads the prompt together with the image (through
its vision tower), and the transformer reads the image's VAE latents appended after the
noisy latents, predicting for both and keeping the target's part. Everything else (true
CFG, the scheduler, decoding) is Qwen-Image's.

The code is written for a list of input images (`ConditionImages`), as Edit-Plus
(edit_plus_pipeline.py) takes 1-3 of them; Qwen-Image-Edit takes exactly one.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import DenoiseState, pack_latents
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.qwen_image.pipeline import QwenImage
from omnistage.models.qwen_image.vl_processor import expand_image_tokens

# QwenImageEditPipeline resizes the input image to about this many pixels (keeping its aspect
# ratio, sides a multiple of 32) whatever output size is asked for; that size is also the
# default output size.
CONDITION_IMAGE_AREA = 1024 * 1024


def condition_size(image: Any, area: int = CONDITION_IMAGE_AREA) -> tuple[int, int]:
    """(width, height) of about `area` pixels with the image's aspect ratio, sides a multiple
    of 32, that the input image is resized to (QwenImageEdit's calculate_dimensions)."""
    ratio = image.size[0] / image.size[1]
    width = math.sqrt(area * ratio)
    height = width / ratio
    return round(width / 32) * 32, round(height / 32) * 32


@dataclass(frozen=True)
class ConditionImages:
    """A request's input images as each encoder sees them, resized, in request order."""

    vision: list[Any]
    """What the text encoder's vision tower reads."""
    vae: list[Any]
    """What the VAE encodes into the latents appended after the target's."""


class QwenImageEdit(QwenImage):
    reference_class: ClassVar[str] = "QwenImageEditPipeline"
    needs_image: ClassVar[bool] = True
    max_images: ClassVar[int] = 1
    """Most input images one request may carry."""
    # QwenImageEditPipeline.__call__ defaults; height/width default to the input image's
    # resized size, so they are filled per request (prepare_request).
    default_params: ClassVar[dict[str, Any]] = {
        "num_inference_steps": 50,
        "true_cfg_scale": 4.0,
    }
    # diffusers' edit pipeline takes max_sequence_length but never truncates the prompt
    # (it holds image tokens); we do not accept an extra that would have no effect.
    extras: ClassVar[dict[str, ExtraSpec]] = {}

    prompt_template: ClassVar[str] = (
        "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
        "objects, background), then explain how the user's text instruction should alter or modify the image. "
        "Generate a new image that meets the user's requirements while maintaining consistency with the "
        "original input where appropriate.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|>"
        "<|vision_end|>{}<|im_end|>\n<|im_start|>assistant\n"
    )
    prompt_template_start_idx: ClassVar[int] = 64

    def _checkpoint_defaults(self) -> dict[str, Any]:
        return dict(type(self).default_params)

    # The checkpoint's `processor` is a Qwen2VLProcessor, which transformers only builds with
    # torchvision installed (its video half). Only its image half is needed: the vision image
    # processor, which loads without torchvision; the tokenizer is the pipeline's own.
    loader_overrides: ClassVar[dict[str, Any]] = {"processor": None}

    @classmethod
    def from_diffusers(cls, pipe: Any, path: str, configs: CheckpointConfigs, device: torch.device | str,
                       dtype: torch.dtype) -> "QwenImageEdit":
        from transformers import AutoImageProcessor

        components = {**pipe.components,
                      "vision_processor": AutoImageProcessor.from_pretrained(path, subfolder="processor")}
        return cls(components, device, dtype, configs)

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        if len(request.images) > self.max_images:
            allowed = "one input image" if self.max_images == 1 else f"1 to {self.max_images} input images"
            raise RequestError("image", f"image: this model edits {allowed}, got {len(request.images)}")

    def prepare_request(self, request: DiffusionRequest) -> DiffusionRequest:
        request = super().prepare_request(request)
        params = request.params
        if params.height is None or params.width is None:
            # The last input image's shape, as in diffusers (Edit has only one).
            width, height = condition_size(request.images[-1])
            # As diffusers: the default size rounded down to what the 2x2 packing allows.
            size = {"height": params.height or height // self.multiple_of * self.multiple_of,
                    "width": params.width or width // self.multiple_of * self.multiple_of}
            request = dataclasses.replace(request, params=params.model_copy(update=size))
        return request

    # -- 2. encode: the input image joins the prompt and the latents -----------------------

    def _condition_image(self, request: DiffusionRequest) -> ConditionImages:
        """The input image resized to its condition size, as RGB: both encoders see the same one."""
        image = self._resized(request.images[0], CONDITION_IMAGE_AREA)
        return ConditionImages(vision=[image], vae=[image])

    def _resized(self, image: Any, area: int) -> Any:
        width, height = condition_size(image, area)
        return self.image_processor.resize(image.convert("RGB"), height, width)

    def _text_inputs(self, texts: list[str], images: list[ConditionImages]) -> dict[str, torch.Tensor]:
        # What Qwen2VLProcessor does: the vision processor patches every image, and each image
        # placeholder, in order, is expanded to one token per merged patch of its image.
        vision = self.vision_processor(images=[i for c in images for i in c.vision], return_tensors="pt")
        grids = iter(vision["image_grid_thw"])
        texts = [expand_image_tokens(text, grids, self.vision_processor.merge_size ** 2) for text in texts]
        tokens = self.tokenizer(texts, padding=True, return_tensors="pt")
        return {
            "input_ids": tokens.input_ids.to(self.device),
            "attention_mask": tokens.attention_mask.to(self.device),
            "pixel_values": vision["pixel_values"].to(self.device, self.text_encoder.dtype),
            "image_grid_thw": vision["image_grid_thw"].to(self.device),
        }

    def _truncate(self, embeds: torch.Tensor, request: DiffusionRequest) -> torch.Tensor:
        return embeds  # no max_sequence_length (see `extras`)

    def _initial_state(self, request: DiffusionRequest, image: ConditionImages, prompt_embeds: torch.Tensor,
                       negative_embeds: torch.Tensor | None) -> DenoiseState:
        state = super()._initial_state(request, image, prompt_embeds, negative_embeds)
        # Each input image's normalised VAE latents (the distribution's mode: no noise drawn),
        # one token grid per image, in request order.
        packed = []
        for vae_image in image.vae:
            width, height = vae_image.size
            pixels = self.image_processor.preprocess(vae_image, height, width).unsqueeze(2)  # [1, 3, 1 frame, H, W]
            latents = self.vae_encode(pixels.to(self.device, prompt_embeds.dtype)).latent_dist.mode()
            mean, std = self._latents_stats(latents)
            packed.append(pack_latents(((latents - mean) / std)[:, :, 0]))
            state.cond["img_shapes"] += ((1, height // self.vae_scale_factor // 2, width // self.vae_scale_factor // 2),)
        state.cond["image_latents"] = torch.cat(packed, dim=1).repeat(state.latents.shape[0], 1, 1)
        return state

    # -- 3. denoise: Qwen-Image's, over the target and input-image tokens ---------------------

    def _model_input(self, state: DenoiseState) -> torch.Tensor:
        return torch.cat([state.latents, state.cond["image_latents"]], dim=1)
