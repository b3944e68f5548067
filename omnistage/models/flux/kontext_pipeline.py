"""FLUX.1-Kontext: FLUX.1 (pipeline.py) editing an input image, which the transformer reads as
extra latent tokens.

Reproduces `diffusers.FluxKontextPipeline` (pipelines/flux/pipeline_flux_kontext.py) on top of
`Flux`: the input image is resized (by default to the nearest of Kontext's ~1 megapixel
training resolutions, `PREFERRED_KONTEXT_RESOLUTIONS`), VAE-encoded (the distribution's mode:
no noise drawn), packed into 2x2 tokens with position ids on a second plane (first id 1), and
appended after the noisy latents; the transformer predicts both and the target's part is kept.
Prompts, guidance (the distilled embedding, true CFG on a negative prompt), the noise schedule
and decoding are FLUX.1's. Without an input image it generates from text, as diffusers does.

Output size: diffusers rescales height x width to `max_area` (1024**2 by default) at the same
aspect ratio, so it only honours an asked size whose area is `max_area`. We generate the size
asked for (the same as diffusers with `max_area=height*width`) and take no `max_area`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import DenoiseState, pack_latents
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.flux.pipeline import Flux


class FluxKontext(Flux):
    reference_class: ClassVar[str] = "FluxKontextPipeline"
    takes_image: ClassVar[bool] = True
    """One input image to edit; without one Kontext generates from the prompt alone."""
    extras: ClassVar[dict[str, ExtraSpec]] = {
        **Flux.extras,
        "auto_resize": ExtraSpec(bool, default=True,
                                 help="Resize the input image to the nearest of Kontext's training resolutions "
                                      "(diffusers' `_auto_resize`); false keeps its size, rounded down to a "
                                      "multiple of 16."),
    }

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        if len(request.images) > 1:
            raise RequestError("image", f"image: this model edits one input image, got {len(request.images)}")
        if request.images and not request.params.extras["auto_resize"]:
            width, height = request.images[0].size
            if min(width, height) < self.multiple_of:
                raise RequestError("image", f"image: with auto_resize false each side must be at least "
                                   f"{self.multiple_of} pixels, got {width}x{height}")

    # -- 2. encode: the input image joins the latents -------------------------------------

    def _initial_state(self, request: DiffusionRequest, prompt: tuple[torch.Tensor, torch.Tensor],
                       negative: tuple[torch.Tensor, torch.Tensor] | None) -> DenoiseState:
        state = super()._initial_state(request, prompt, negative)
        if request.images:
            latents, ids = self._image_tokens(request.images[0], request.params.extras["auto_resize"], prompt[0].dtype)
            state.cond["image_latents"] = latents.expand(state.latents.shape[0], *latents.shape[1:])
            state.cond["image_size"] = tuple(latents.shape[1:])
            # One id table for the whole image stream: the target's grid, then the input image's.
            state.cond["latent_image_ids"] = torch.cat([state.cond["latent_image_ids"], ids])
        return state

    def _image_tokens(self, image: Any, auto_resize: bool, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(the input image's packed, normalised VAE latents [1, tokens, C * 4], their position
        ids [tokens, 3]), as FluxKontextPipeline prepares them."""
        from diffusers.pipelines.flux.pipeline_flux import FluxPipeline
        from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS

        image = image.convert("RGB")
        height, width = self.image_processor.get_default_height_width(image)
        if auto_resize:  # Kontext is trained on these resolutions: the one nearest in aspect ratio
            _, width, height = min((abs(width / height - w / h), w, h) for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
        height, width = height // self.multiple_of * self.multiple_of, width // self.multiple_of * self.multiple_of
        pixels = self.image_processor.preprocess(self.image_processor.resize(image, height, width), height, width)
        latents = self.vae_encode(pixels.to(self.device, dtype)).latent_dist.mode()
        latents = (latents - self.vae.config.shift_factor) * self.vae.config.scaling_factor
        ids = FluxPipeline._prepare_latent_image_ids(1, latents.shape[2] // 2, latents.shape[3] // 2, self.device, dtype)
        ids[..., 0] = 1  # the input image's plane
        return pack_latents(latents), ids

    # -- 3. denoise: FLUX.1's, over the target and input-image tokens ----------------------

    def _group_key(self, state: DenoiseState) -> tuple:
        # The input image's token grid is part of the shared position ids too.
        return (*super()._group_key(state), state.cond.get("image_size"))

    def _model_input(self, state: DenoiseState) -> torch.Tensor:
        if "image_latents" not in state.cond:
            return state.latents
        return torch.cat([state.latents, state.cond["image_latents"]], dim=1)
