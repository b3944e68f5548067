"""GLM-Image's DiT stage: prior image tokens + glyph embeddings -> image.

Reproduces the part of `diffusers.GlmImagePipeline` (pipelines/glm_image/pipeline_glm_image.py)
after `generate_prior_tokens`, split at the encode / denoise_step / decode seams. The AR
prior runs upstream (prior.py); its tokens arrive as `request.condition["prior_token_ids"]`
(the 2x-upsampled target grid, one id per DiT patch), exactly what diffusers' `prior_token_ids=`
argument takes. The T5 glyph encoder sees only the quoted text of the prompt, as in diffusers.

CFG (`guidance_scale > 1`): the uncond branch has the empty prompt's glyph embeddings and
its prior tokens dropped; one transformer call per branch, as diffusers calls them.
Image-to-image (condition images through the DiT's KV cache) is not supported: requests
with an image are refused.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.accel.step_cache import BlockChain
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg, scale_if_negative
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_divisible,
    current_timesteps,
    image_size,
    map_groups,
    split_per_state,
)
from omnistage.core.errors import RequestError
from omnistage.models.glm_image.grid import DEFAULT_SIZE, PIXELS_PER_TOKEN, prior_grid
from omnistage.diffusion.accel.declaration import Accelerations


class GlmImage(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "GlmImagePipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        step_caches=("first_block_cache", "easycache", "cache_dit"), cfg_parallel=True, vae_patch_parallel=True, vae_tiling=True, offload=True, quantization=True,
        compile=True, refused={"cache_backend: tea_cache": "no modulated-input extractor for its blocks"})
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->vae"
    # The AR model and its processor belong to the prior stage: this stage never loads them.
    loader_overrides: ClassVar[dict[str, Any]] = {"vision_language_encoder": None, "processor": None}
    # GlmImagePipeline.__call__ defaults; it has no default size (the prompt's grid sets it),
    # ours is DEFAULT_SIZE (grid.py), the same one the prior stage uses.
    default_params: ClassVar[dict[str, Any]] = {
        "num_inference_steps": 50,
        "guidance_scale": 1.5,
        "height": DEFAULT_SIZE,
        "width": DEFAULT_SIZE,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, max_from=("tokenizer",), default=2048, min=1, max=2048,
                                         help="Glyph-encoder tokens per quoted text (longer ones are truncated)."),
    }

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.image_processor import VaeImageProcessor

        components = {k: v for k, v in components.items() if v is not None}
        super().__init__(components, device, dtype, configs)
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.vae_scale_factor)
        self._negative_embeds: dict[int, torch.Tensor] = {}  # the empty prompt's, by max_sequence_length

    def configure(self, configs: CheckpointConfigs) -> None:
        self.vae_scale_factor = 2 ** (len(configs.vae.block_out_channels) - 1)
        transformer = configs.transformer
        self.codebook_size = transformer.get("prior_vq_quantizer_codebook_size", 16384)
        # The prior grid is one token per 32 pixels, upsampled 2x to one per DiT patch, so a
        # patch must be 16 pixels (diffusers checks height % (vae factor * patch * 2)).
        self.multiple_of = self.vae_scale_factor * transformer.get("patch_size", 2) * 2
        if self.multiple_of != PIXELS_PER_TOKEN:
            raise ValueError(f"GLM-Image needs VAE factor x patch size = {PIXELS_PER_TOKEN // 2} pixels per DiT "
                             f"patch (the prior's token grid), got {self.multiple_of // 2}")

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        if request.images:
            raise RequestError("image", "image: GLM-Image image-to-image is not supported; send a prompt only")
        params = request.params  # defaults filled (prepare_request)
        check_divisible(params, height=self.multiple_of, width=self.multiple_of)
        ids = request.condition.get("prior_token_ids")
        if ids is None:
            raise RequestError("prior_token_ids", "prior_token_ids: GLM-Image draws the image tokens its AR prior stage writes; "
                               "this request has none")
        want = prior_grid(params.height, params.width).num_dit_tokens
        if len(ids) != want:
            raise RequestError("prior_token_ids", f"prior_token_ids: {len(ids)} tokens do not fit a {params.height}x{params.width} "
                               f"image, which takes {want}")
        if min(ids) < 0 or max(ids) >= self.codebook_size:
            raise RequestError("prior_token_ids", f"prior_token_ids must be image codes in [0, {self.codebook_size})")

    # -- 2. encode: glyph embeddings, prior tokens, initial noise, timesteps --------------

    def _glyph_embeds(self, prompt: str, max_sequence_length: int) -> torch.Tensor:
        """[1, L, D]: T5 states of the prompt's quoted texts, concatenated (GlmImagePipeline._get_glyph_embeds
        for one prompt: each text padded to an even length, padding dropped)."""
        from diffusers import GlmImagePipeline

        texts = GlmImagePipeline.get_glyph_texts(None, prompt)[0] or [""]
        pad = self.tokenizer.pad_token_id
        ids = self.tokenizer(texts, max_length=max_sequence_length, truncation=True).input_ids
        ids = [[pad] * ((len(ids) + 1) % 2) + row for row in ids]
        longest = max(len(row) for row in ids)
        mask = torch.tensor([[1] * len(row) + [0] * (longest - len(row)) for row in ids], device=self.device)
        ids = torch.tensor([row + [pad] * (longest - len(row)) for row in ids], device=self.device)
        states = self.text_encoder(ids, attention_mask=mask).last_hidden_state
        return states[mask.bool()].unsqueeze(0).to(self.dtype)

    def _negative(self, max_sequence_length: int) -> torch.Tensor:
        if max_sequence_length not in self._negative_embeds:
            self._negative_embeds[max_sequence_length] = self._glyph_embeds("", max_sequence_length)
        return self._negative_embeds[max_sequence_length]

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        return [self._initial_state(r) for r in requests]

    def _initial_state(self, request: DiffusionRequest) -> DenoiseState:
        from diffusers.pipelines.glm_image.pipeline_glm_image import calculate_shift, retrieve_timesteps
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        n, max_len = params.num_outputs_per_prompt, params.extras["max_sequence_length"]
        guided = params.guidance_scale > 1
        embeds = self._glyph_embeds(request.prompt, max_len)
        shape = (n, self.transformer.config.in_channels, params.height // self.vae_scale_factor,
                 params.width // self.vae_scale_factor)
        latents = randn_tensor(shape, generator=self.generator_for(request), device=self.device, dtype=embeds.dtype)

        # diffusers' schedule: integer timesteps from 1000 down, sigmas = t / 1000, shifted by
        # mu of the image's patch count.
        noise_scheduler = self.noise_scheduler_copy()
        steps = params.num_inference_steps
        timesteps = np.linspace(noise_scheduler.config.num_train_timesteps, 1.0, steps + 1)[:-1]
        timesteps = timesteps.astype(np.int64).astype(np.float32)
        patch = self.transformer.config.patch_size
        image_seq_len = (shape[2] * shape[3]) // patch**2
        mu = calculate_shift(image_seq_len, noise_scheduler.config.get("base_image_seq_len", 256),
                             noise_scheduler.config.get("base_shift", 0.25), noise_scheduler.config.get("max_shift", 0.75))
        timesteps, _ = retrieve_timesteps(noise_scheduler, steps, self.device, timesteps,
                                          timesteps / noise_scheduler.config.num_train_timesteps, mu=mu)

        prior = torch.tensor(request.condition["prior_token_ids"], device=self.device, dtype=torch.long)
        cond: dict[str, Any] = {
            "prompt_embeds": embeds.expand(n, -1, -1),
            "negative_prompt_embeds": self._negative(max_len).expand(n, -1, -1) if guided else None,
            "prior_token_ids": prior[None].expand(n, -1),
            "target_size": torch.tensor([[params.height, params.width]], dtype=embeds.dtype,
                                        device=self.device).expand(n, -1),
            "crop_coords": torch.zeros(n, 2, dtype=embeds.dtype, device=self.device),
            "guidance_scale": params.guidance_scale,
        }
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler, timesteps=timesteps, cond=cond)

    # -- 3. denoise -----------------------------------------------------------------------

    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative(), combine=plain_cfg)

    # The step caches wrap the DiT's blocks (first-block cache; TeaCache has no coefficients
    # or modulated input for GLM-Image and is refused, cache-dit does not know the model).
    step_cache_blocks: ClassVar[BlockChain] = BlockChain(blocks=("transformer_blocks",), io="positional_pair")

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # One transformer call needs one latent size and one glyph length (diffusers left-pads
        # glyphs with zeros and no mask, which would change a padded request's result).
        def key(s: DenoiseState) -> tuple:
            return s.request.params.height, s.request.params.width, s.cond["prompt_embeds"].shape[1]

        self.guided_steps(states, key, self._predict)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """One branch's transformer call over its rows; the uncond branch drops the prior tokens."""
        states = [s for s, _ in rows]
        branch = rows[0][1]
        embeds = "prompt_embeds" if branch == "cond" else "negative_prompt_embeds"
        latents = torch.cat([s.latents for s in states])
        prior = torch.cat([s.cond["prior_token_ids"] for s in states])
        with self.transformer.cache_context(branch):
            noise_pred = self.transformer(
                hidden_states=latents.to(self.transformer.dtype),
                encoder_hidden_states=torch.cat([s.cond[embeds] for s in states]),
                prior_token_id=prior,
                prior_token_drop=torch.full_like(prior, branch == "uncond", dtype=torch.bool),
                timestep=current_timesteps(states) - 1,
                target_size=torch.cat([s.cond["target_size"] for s in states]),
                crop_coords=torch.cat([s.cond["crop_coords"] for s in states]),
                return_dict=False,
            )[0].float()
        return split_per_state(noise_pred, states)

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        return map_groups(states, image_size, self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        latents = torch.cat([s.latents for s in states]).to(self.vae.dtype)
        channels = self.vae.config.latent_channels
        mean = torch.tensor(self.vae.config.latents_mean).view(1, channels, 1, 1).to(latents.device, latents.dtype)
        std = torch.tensor(self.vae.config.latents_std).view(1, channels, 1, 1).to(latents.device, latents.dtype)
        images = self.vae_decode(latents * std + mean)
        return split_per_state(self.image_processor.postprocess(images, output_type="np"), states)
