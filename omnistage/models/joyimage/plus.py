"""JoyAI-Image-Edit-Plus: several reference images, each at its own size, and an instruction
-> image. The edit pipeline (pipeline.py) with three differences, as in diffusers'
`JoyImageEditPlusPipeline` (pipelines/joyimage/pipeline_joyimage_edit_plus.py):

- every reference image is resized to the ~1-megapixel bucket nearest its own aspect ratio; the
  encoder reads them all (one vision block each, in order) before the instruction, and the
  unguided branch reads them before a blank (" ") or the negative prompt;
- the transformer (`JoyImageEditPlusTransformer3DModel`) takes one sequence of 2x2 patches: the
  target's first, then each reference's (their latents are the VAE posterior's mode, normalized),
  with each item's (frames, height, width) in `shape_list` for its RoPE and a text mask;
- the default output size is the last reference image's bucket.

A request holds one prompt and its references (diffusers' `images=[...]` for one prompt), one
output; requests whose references have the same sizes share a transformer call, both CFG branches
and any prompt lengths in it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.accel.declaration import Accelerations
from omnistage.diffusion.guidance import Guidance, Rows
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_divisible,
    current_timesteps,
    group_by,
)
from omnistage.models.joyimage.pipeline import MAX_TEXT_TOKENS, SYSTEM_TOKENS, BUCKET_BASE, JoyImageEdit
from omnistage.models.qwen_image.vl_processor import prenorm_last_hidden_states

# JoyImageEditPlusPipeline's "multiple_images" template; the user turn carries one vision block per image.
PROMPT_TEMPLATE = (
    "<|im_start|>system\n \\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n{}<|im_start|>assistant\n"
)
VISION_BLOCK = "<|vision_start|><|image_pad|><|vision_end|>"


def bucket(image: Any) -> tuple[int, int]:
    """(height, width): the ~1-megapixel bucket nearest `image`'s aspect ratio (diffusers' rule)."""
    from diffusers.pipelines.joyimage import image_processor

    width, height = image.size
    return image_processor.find_best_bucket(height, width, BUCKET_BASE)


class JoyImageEditPlus(JoyImageEdit):
    reference_class: ClassVar[str] = "JoyImageEditPlusPipeline"
    supported_accelerations: ClassVar[Accelerations] = dataclasses.replace(
        JoyImageEdit.supported_accelerations,
        refused={**JoyImageEdit.supported_accelerations.refused,
                 "lora": "diffusers' JoyImageEditPlusPipeline has no LoRA loader"})
    # JoyImageEditPlusPipeline.__call__ defaults; height/width follow the last image (prepare_request).
    default_params: ClassVar[dict[str, Any]] = {"num_inference_steps": 30, "guidance_scale": 4.0}

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        DiffusionPipelineBase.check_inputs(self, request)  # one image at least, no control video; any number
        if request.params.num_outputs_per_prompt != 1:
            raise RequestError("num_outputs_per_prompt", "num_outputs_per_prompt: JoyAI-Image-Edit-Plus makes one "
                                                         f"image per prompt, got {request.params.num_outputs_per_prompt}")
        check_divisible(request.params, height=self.multiple_of, width=self.multiple_of)

    def prepare_request(self, request: DiffusionRequest) -> DiffusionRequest:
        request = super(JoyImageEdit, self).prepare_request(request)
        params = request.params
        if params.height is None or params.width is None:
            height, width = bucket(request.images[-1])
            size = {"height": params.height or height, "width": params.width or width}
            request = dataclasses.replace(request, params=params.model_copy(update=size))
            self.check_inputs(request)
        return request

    # -- 2. encode: the references for the encoder and the VAE, the target's noise ----------

    def _prompt_embeds(self, texts: list[str], images: list[list[Any]]) -> list[torch.Tensor]:
        """[L, D] per text: it after one vision block per image of its list, read with them, the
        system turn dropped. One encoder call for all: padding is masked out and cut off, so each
        is what it is alone."""
        prompts = [PROMPT_TEMPLATE.format(f"<|im_start|>user\n{VISION_BLOCK * len(group)}{text}<|im_end|>\n")
                   for text, group in zip(texts, images)]
        inputs = self.processor(text=prompts, images=[image for group in images for image in group], padding=True,
                                return_tensors="pt").to(self.device)
        hidden = prenorm_last_hidden_states(self.text_encoder, dict(inputs))
        return [row[mask.bool()][SYSTEM_TOKENS:][-MAX_TEXT_TOKENS:] for row, mask in zip(hidden, inputs.attention_mask)]

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        images = [[self.edit_image_processor.resize_center_crop(image.convert("RGB"), bucket(image))
                   for image in request.images] for request in requests]
        # diffusers' unguided branch reads a blank prompt after the images unless given one.
        guided = [i for i, r in enumerate(requests) if r.params.guidance_scale > 1]
        texts = [r.prompt for r in requests] + [requests[i].params.negative_prompt or " " for i in guided]
        embeds = self._prompt_embeds(texts, images + [images[i] for i in guided])
        negatives = dict(zip(guided, embeds[len(requests):]))
        return [self._plus_state(r, group, prompt, negatives.get(i))
                for i, (r, group, prompt) in enumerate(zip(requests, images, embeds))]

    def _plus_state(self, request: DiffusionRequest, images: list[Any], prompt: torch.Tensor,
                    negative: torch.Tensor | None) -> DenoiseState:
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        generator = self.generator_for(request)
        shape = (self.transformer.config.in_channels, 1, params.height // self.vae_scale_factor,
                 params.width // self.vae_scale_factor)
        latents = randn_tensor(shape, generator=generator, device=self.device, dtype=prompt.dtype)[None]
        references = []
        for image in images:  # each at its own size: the posterior's mode, normalized
            pixels = self.edit_image_processor.preprocess(image).to(self.device, prompt.dtype).unsqueeze(2)
            encoded = self.vae.encode(pixels.to(self.vae.dtype)).latent_dist.mode().to(prompt.dtype)
            mean, std = self._latents_stats(encoded)
            references.append((encoded - mean) / std)

        noise_scheduler = self.noise_scheduler_copy()
        noise_scheduler.set_timesteps(params.num_inference_steps, device=self.device)
        noise_scheduler.set_begin_index(0)
        cond = {"prompt_embeds": prompt[None], "negative_prompt_embeds": None if negative is None else negative[None],
                "reference_patches": torch.cat([self._patchify(r) for r in references], dim=1),
                "shape_list": tuple(self._patch_grid(x) for x in (latents, *references)),
                "guidance_scale": params.guidance_scale}
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler,
                            timesteps=noise_scheduler.timesteps, cond=cond)

    def _patch_grid(self, latents: torch.Tensor) -> tuple[int, int, int]:
        pt, ph, pw = self.transformer.config.patch_size
        _, _, t, h, w = latents.shape
        return t // pt, h // ph, w // pw

    def _patchify(self, latents: torch.Tensor) -> torch.Tensor:
        """[1, C, T, H, W] -> [1, patches, C, pt, ph, pw] (JoyImageEditPlusPipeline.prepare_latents)."""
        pt, ph, pw = self.transformer.config.patch_size
        c = latents.shape[1]
        lt, lh, lw = self._patch_grid(latents)
        patches = latents[0].reshape(c, lt, pt, lh, ph, lw, pw).permute(1, 3, 5, 0, 2, 4, 6)
        return patches.reshape(1, -1, c, pt, ph, pw)

    def _unpatchify(self, patches: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """[1, lt*lh*lw, C, pt, ph, pw] -> [1, C, T, H, W] (the pipeline's decode reshape)."""
        pt, ph, pw = self.transformer.config.patch_size
        lt, lh, lw = grid
        c = patches.shape[2]
        latents = patches.reshape(lt, lh, lw, c, pt, ph, pw).permute(3, 0, 4, 1, 5, 2, 6)
        return latents.reshape(1, c, lt * pt, lh * ph, lw * pw)

    # -- 3. denoise -----------------------------------------------------------------------

    guidance: ClassVar[Guidance] = dataclasses.replace(JoyImageEdit.guidance, batch_branches=True)
    """As diffusers: both branches in one call, prompts of any length padded under the text mask."""

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """Each row's prediction: one transformer call per set of item sizes, every branch and
        prompt length in it (shorter prompts padded at the end and masked out, as diffusers pads
        the negative prompt to the positive's length)."""
        preds: dict[int, torch.Tensor] = {}
        for group in group_by(rows, lambda row: row[0].cond["shape_list"]):
            preds.update(zip(map(id, group), self._predict_group(group)))
        return [preds[id(row)] for row in rows]

    def _predict_group(self, rows: Rows) -> list[torch.Tensor]:
        states = [s for s, _ in rows]
        texts = [s.cond["prompt_embeds" if branch == "cond" else "negative_prompt_embeds"] for s, branch in rows]
        length = max(t.shape[1] for t in texts)
        text = torch.cat([torch.nn.functional.pad(t, (0, 0, 0, length - t.shape[1])) for t in texts])
        mask = torch.stack([torch.arange(length, device=text.device) < t.shape[1] for t in texts]).long()
        # One sequence per row: the target's patches, then the references'.
        items = torch.cat([torch.cat([self._patchify(s.latents), s.cond["reference_patches"]], dim=1) for s in states])
        pred = self.transformer(hidden_states=items, timestep=current_timesteps(states).to(items.dtype),
                                encoder_hidden_states=text, encoder_hidden_states_mask=mask,
                                shape_list=[list(s.cond["shape_list"]) for s in states], return_dict=False)[0]
        grid = states[0].cond["shape_list"][0]
        num_target = grid[0] * grid[1] * grid[2]
        return [self._unpatchify(p[None, :num_target], grid) for p in pred]
