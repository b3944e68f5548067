"""LongCat-Image-Edit: LongCat-Image (pipeline.py) editing an input image, which the model sees
twice: through the text encoder's vision tower and as extra latent tokens.

Reproduces `diffusers.LongCatImageEditPipeline` (pipelines/longcat_image/
pipeline_longcat_image_edit.py) on top of `LongCatImage`: the input image is resized to the
output size and VAE-encoded (the distribution's mode: no noise drawn), packed and appended after
the noisy latents on a third position plane; the transformer predicts both and the target's part
is kept. The prompt block is LongCat-Image's with the image, resized to half the output size,
placed before it; the embeddings keep the image's vision tokens, so the text is longer than
TEXT_TOKENS and the latent grids start past it. CFG is plain (the edit pipeline has no renorm).

Output size: diffusers takes none; it generates about a megapixel at the input image's aspect
ratio (`calculate_dimensions`), which is our default. A size asked for (`height`/`width`, the
edit route's `size`) resizes the input image to it, where diffusers would use its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.guidance import Guidance, plain_cfg, scale_if_negative
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import DenoiseState, map_groups, pack_latents
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.longcat_image.pipeline import LongCatImage
from omnistage.models.qwen_image.vl_processor import expand_image_tokens

# LongCatImageEditPipeline.__init__'s prompt prefix: the system prompt, then the input image.
EDIT_PROMPT_PREFIX = (
    "<|im_start|>system\nAs an image editing expert, first analyze the content and attributes of the input "
    "image(s). Then, based on the user's editing instructions, clearly and precisely determine how to modify the "
    "given image(s), ensuring that only the specified parts are altered and all other aspects remain consistent "
    "with the original(s).<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
)
OUTPUT_AREA = 1024 * 1024  # the pixels diffusers generates, at the input image's aspect ratio


class LongCatImageEdit(LongCatImage):
    reference_class: ClassVar[str] = "LongCatImageEditPipeline"
    needs_image: ClassVar[bool] = True
    # LongCatImageEditPipeline.__call__ defaults; height/width follow the input image (prepare_request).
    default_params: ClassVar[dict[str, Any]] = {"num_inference_steps": 50, "guidance_scale": 4.5}
    # Neither the renorm nor the prompt rewrite exists in the edit pipeline.
    extras: ClassVar[dict[str, ExtraSpec]] = {}
    _optional_components: ClassVar[list[str]] = []
    loader_overrides: ClassVar[dict[str, Any]] = {}

    @classmethod
    def loader_kwargs(cls, path: str) -> dict[str, Any]:
        # diffusers' __init__ reads the text_processor's image processor (the vision tower's
        # input), and transformers cannot build a Qwen2VLProcessor here: built from its halves.
        from transformers import Qwen2VLProcessor

        from omnistage.models.qwen_image.vl_processor import processor_from_parts

        return {"text_processor": processor_from_parts(Qwen2VLProcessor, path, "text_processor")}

    def configure(self, configs: Any) -> None:
        super().configure(configs)
        self.default_params = dict(type(self).default_params)

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        if len(request.images) > 1:
            raise RequestError("image", f"image: this model edits one input image, got {len(request.images)}")

    def prepare_request(self, request: DiffusionRequest) -> DiffusionRequest:
        from diffusers.pipelines.longcat_image.pipeline_longcat_image_edit import calculate_dimensions

        request = super().prepare_request(request)
        params = request.params
        if params.height is None or params.width is None:
            width, height = request.images[0].size
            width, height = calculate_dimensions(OUTPUT_AREA, width / height)
            size = {"height": params.height or height, "width": params.width or width}
            request = dataclasses.replace(request, params=params.model_copy(update=size))
            self.check_inputs(request)  # the filled size must divide too
        return request

    # -- 2. encode: the input image joins the prompt and the latents -----------------------

    def _condition_images(self, request: DiffusionRequest) -> tuple[Any, Any]:
        """(the input image at the output size, for the VAE; at half of it, for the vision tower)."""
        params = request.params
        image = self.image_processor.resize(request.images[0].convert("RGB"), params.height, params.width)
        return image, self.image_processor.resize(image, params.height // 2, params.width // 2)

    def _encode_with_images(self, prompts: list[str], images: list[Any]) -> torch.Tensor:
        """[N, vision + TEXT_TOKENS, D] for prompts each read with its image (all of one size):
        the embeddings from the image's <|vision_start|> to the end of the padded prompt."""
        processor = self.text_processor.image_processor
        vision = processor(images=images, return_tensors="pt")
        prefix = expand_image_tokens(EDIT_PROMPT_PREFIX, iter(vision["image_grid_thw"]), processor.merge_size ** 2)
        input_ids, mask = self._prompt_block(prompts, prefix)
        start = self.tokenizer(prefix, add_special_tokens=False)["input_ids"].index(
            self.tokenizer.convert_tokens_to_ids("<|vision_start|>"))
        out = self.text_encoder(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                                pixel_values=vision["pixel_values"].to(self.device, self.text_encoder.dtype),
                                image_grid_thw=vision["image_grid_thw"].to(self.device), output_hidden_states=True)
        return out.hidden_states[-1][:, start: -self._suffix_length]

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # Every prompt, then the negative prompts ("" unless given) of the requests that run CFG,
        # each with its request's image; one text-encoder call per image size (equal lengths).
        images = [self._condition_images(r) for r in requests]
        guided = [i for i, r in enumerate(requests) if r.params.guidance_scale > 1]
        texts = [r.prompt for r in requests] + [requests[i].params.negative_prompt or "" for i in guided]
        vision = [v for _, v in images] + [images[i][1] for i in guided]
        embeds = map_groups(list(range(len(texts))), lambda i: vision[i].size,
                            lambda rows: list(self._encode_with_images([texts[i] for i in rows],
                                                                       [vision[i] for i in rows])))
        negative_of = dict(zip(guided, embeds[len(requests):]))
        return [self._edit_state(r, vae_image, e, negative_of.get(i))
                for i, (r, (vae_image, _), e) in enumerate(zip(requests, images, embeds))]

    def _edit_state(self, request: DiffusionRequest, image: Any, prompt: torch.Tensor,
                    negative: torch.Tensor | None) -> DenoiseState:
        state = self._initial_state(request, prompt, negative)
        params = request.params
        pixels = self.image_processor.preprocess(image, params.height, params.width)
        latents = self.vae_encode(pixels.to(self.device, prompt.dtype)).latent_dist.mode()
        latents = (latents - self.vae.config.shift_factor) * self.vae.config.scaling_factor
        state.cond["image_latents"] = pack_latents(latents).expand(state.latents.shape[0], -1, -1)
        # One id table for the whole image stream: the target's grid (plane 1), then the input
        # image's, the same grid on plane 2.
        input_ids = self._image_ids(2, prompt.shape[0], latents.shape[2], latents.shape[3])
        state.cond["latent_image_ids"] = torch.cat([state.cond["latent_image_ids"], input_ids])
        return state

    def _guidance_cond(self, params: Any) -> dict[str, Any]:
        return {"guidance_scale": params.guidance_scale}

    # -- 3. denoise: LongCat-Image's, over the target and input-image tokens -----------------

    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative(), combine=plain_cfg)

    def _model_input(self, state: DenoiseState) -> torch.Tensor:
        return torch.cat([state.latents, state.cond["image_latents"]], dim=1)
