"""The bases of image pipelines whose transformer reads VAE latents in 2x2 patches (Flux and the
families built like it: HiDream-I1, Ovis-Image, LongCat-Image, Z-Image).

`PatchImagePipeline`: they share how the checkpoint fixes sizes: the VAE downsamples by 2 per
block after the first, the patches double that, and diffusers' default side is
`default_sample_size` latent pixels.

`FluxStylePipeline`: the families that also keep FLUX.1's transformer (Flux, Ovis-Image,
LongCat-Image) share its denoising and decoding: latents packed as 2x2 patch tokens, one call
per branch with text and image position ids shared by the call, dual- then single-stream blocks.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.accel.step_cache import BlockChain
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Rows
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    check_divisible,
    current_timesteps,
    decode_images,
    flow_sigmas,
    grid_and_prompt_length,
    image_size,
    latent_grid,
    map_groups,
    pack_latents,
    set_flow_match_timesteps,
    split_per_state,
    unpack_latents,
)
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


def flux_modulated_input(block: Any, kwargs: dict) -> torch.Tensor:
    """TeaCache's input: FLUX's first block's AdaLN-Zero-normed, timestep-modulated image tokens."""
    return block.norm1(kwargs["hidden_states"], emb=kwargs["temb"])[0]


class FluxStylePipeline(PatchImagePipeline):
    """Denoising and decoding of a pipeline with FLUX.1's transformer; the family adds its prompts,
    position ids (`cond["text_ids"]`, `cond["latent_image_ids"]`) and guidance."""

    # Step caches wrap the dual-stream then the single-stream blocks (FLUX's layout: keyword
    # inputs, (text, image) outputs). TeaCache compares the first block's AdaLN-Zero-normed,
    # timestep-modulated image tokens; a family without published coefficients: no rescaling.
    step_cache_blocks: ClassVar[BlockChain] = BlockChain(
        blocks=("transformer_blocks", "single_transformer_blocks"),
        io="dual_stream",
        modulated_input=lambda block, args, kwargs: flux_modulated_input(block, kwargs),
    )

    # -- 2. encode helpers ----------------------------------------------------------------

    def packed_noise(self, request: DiffusionRequest, dtype: torch.dtype) -> torch.Tensor:
        """The request's initial latents as tokens: drawn unpacked, as one [n, C, H, W] tensor in
        `dtype` from its own generator (as diffusers draws it for num_images_per_prompt=n), then packed."""
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        shape = (params.num_outputs_per_prompt, self.transformer.config.in_channels // 4,
                 *latent_grid(params, self.multiple_of))
        return pack_latents(randn_tensor(shape, generator=self.generator_for(request), device=self.device, dtype=dtype))

    def flow_timesteps(self, noise_scheduler: Any, num_steps: int, image_seq_len: int) -> torch.Tensor:
        """Set `noise_scheduler` to FLUX's sigmas, shifted for `image_seq_len` tokens; its timesteps."""
        return set_flow_match_timesteps(noise_scheduler, flow_sigmas(noise_scheduler, num_steps), image_seq_len,
                                        self.device, num_steps=num_steps)

    # -- 3. denoise -----------------------------------------------------------------------

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        self.guided_steps(states, self._group_key, self._predict)

    def _group_key(self, state: DenoiseState) -> tuple:
        """States with equal keys share a transformer call (its position ids)."""
        return grid_and_prompt_length(state)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """The transformer's prediction for one branch's rows, one per state; timesteps are per sample."""
        states = [s for s, _ in rows]
        branch = rows[0][1]
        prefix = "" if branch == "cond" else "negative_"
        latents = torch.cat([s.latents for s in states])
        with self.transformer.cache_context(branch):
            pred = self.transformer(
                hidden_states=torch.cat([self._model_input(s) for s in states]),
                timestep=current_timesteps(states).to(latents.dtype) / 1000,
                encoder_hidden_states=torch.cat([s.cond[f"{prefix}prompt_embeds"] for s in states]),
                txt_ids=states[0].cond["text_ids"],
                img_ids=states[0].cond["latent_image_ids"],
                return_dict=False,
                **self._transformer_inputs(states, prefix),
            )[0]
        # An edit pipeline also predicts the input image's tokens appended after the target's.
        return split_per_state(pred[:, : latents.shape[1]], states)

    def _model_input(self, state: DenoiseState) -> torch.Tensor:
        """The transformer's image tokens for `state`: its latents (edit: plus the input image's)."""
        return state.latents

    def _transformer_inputs(self, states: list[DenoiseState], prefix: str) -> dict[str, Any]:
        """The family's further transformer inputs for one branch's call (`prefix` "" or
        "negative_" names its prompt's cond keys): none by default."""
        return {}

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # States with the same image size share one VAE call.
        return map_groups(states, image_size, self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        grid = latent_grid(states[0].request.params, self.multiple_of)
        latents = unpack_latents(torch.cat([s.latents for s in states]), *grid)
        return decode_images(self.vae, self.image_processor, latents, states, self.vae_decode)
