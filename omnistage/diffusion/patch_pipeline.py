"""The base of image pipelines whose transformer reads VAE latents in 2x2 patches (Flux and the
families built like it: HiDream-I1, Ovis-Image, LongCat-Image, Z-Image).

They share how the checkpoint fixes sizes: the VAE downsamples by 2 per block after the first,
the patches double that, and diffusers' default side is `default_sample_size` latent pixels.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.pipeline import DiffusionPipelineBase, check_divisible
from omnistage.diffusion.request import DiffusionRequest


class PatchImagePipeline(DiffusionPipelineBase):
    """Sizes and the image processor of a 2x2-patch image pipeline; the family adds the rest."""

    default_sample_size: ClassVar[int | None] = None
    """diffusers' default side in latent pixels; None = the class's own `default_params` keep the size."""

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.image_processor import VaeImageProcessor

        super().__init__(components, device, dtype, configs)
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.multiple_of)

    def configure(self, configs: CheckpointConfigs) -> None:
        self.vae_scale_factor = 2 ** (len(configs.vae.block_out_channels) - 1)
        # Latents are cut into 2x2 patches, so pixel sizes must divide by twice the VAE factor.
        self.multiple_of = self.vae_scale_factor * 2
        if self.default_sample_size is not None:
            size = self.default_sample_size * self.vae_scale_factor
            self.default_params = {**type(self).default_params, "height": size, "width": size}

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        check_divisible(request.params, height=self.multiple_of, width=self.multiple_of)
