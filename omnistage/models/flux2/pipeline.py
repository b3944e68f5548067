"""FLUX.2 (dev and klein): an LLM text encoder's stacked hidden states, an MMDiT over the
FLUX.2 VAE's 2x2-patchified, batch-normalised latents, and optional reference images.

Reproduces `diffusers.Flux2Pipeline` (pipelines/flux2/pipeline_flux2.py) and
`Flux2KleinPipeline` (pipeline_flux2_klein.py), split at the encode / denoise_step / decode
seams. The two differ only in the text encoder and in guidance:

- FLUX.2-dev (`Flux2`): Mistral-3 (chat template with FLUX.2's system message, hidden states
  of layers 10, 20, 30); guidance-distilled: `guidance_scale` is a transformer input, one
  transformer call per step.
- FLUX.2-klein (`Flux2Klein`, klein_pipeline.py): Qwen3 (its chat template, layers 9, 18, 27); no guidance
  embedding. The base checkpoints run true CFG against a negative prompt ("" unless the
  request gives one) when `guidance_scale > 1`; step-distilled ones (`is_distilled`) run none.

Reference images (`images`, 1 or more: editing and multi-reference generation) are VAE-encoded
and appended to the image tokens at their own time coordinate (10, 20, ...), as in diffusers.
Prompt upsampling (`caption_upsample_temperature`) is not supported.
"""

from __future__ import annotations

import dataclasses

from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.accel.step_cache import BlockChain
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_divisible,
    current_timesteps,
    encode_prompts_by_length,
    flow_sigmas,
    grid_and_prompt_length,
    image_size,
    map_groups,
    repeat_per_output,
    split_per_state,
)
from omnistage.core.errors import RequestError
from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, Accelerations
from omnistage.models.flux2.parallel import SEQUENCE_PLAN, TENSOR_PLAN

# Flux2Pipeline's limits on a reference image (Flux2ImageProcessor.check_image_input) and the
# area it is scaled down to beyond that.
MIN_IMAGE_SIDE = 64
MAX_ASPECT_RATIO = 8
MAX_IMAGE_AREA = 1024 * 1024


class Flux2(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "Flux2Pipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        step_caches=CACHE_BACKENDS, sequence_parallel=SEQUENCE_PLAN, tensor_parallel=TENSOR_PLAN, fsdp=True,
        vae_tiling=True, offload=True, quantization=True, lora=True, compile=True,
        refused={"cfg_parallel_size": "guidance-distilled: it runs no CFG branch"})
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->vae"
    # Flux2Pipeline.__call__ defaults; height/width (128 latent pixels times the VAE factor, or
    # the first reference image's size) are filled in per request.
    default_params: ClassVar[dict[str, Any]] = {"num_inference_steps": 50, "guidance_scale": 4.0}
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, max_from=("tokenizer", "text_encoder"), default=512, min=1, max=512,
                                         help="Text tokens (the chat-formatted prompt is padded to this length)."),
    }
    default_sample_size: ClassVar[int] = 128  # Flux2Pipeline.default_sample_size, in latent pixels
    text_encoder_out_layers: ClassVar[tuple[int, ...]] = (10, 20, 30)
    # The checkpoint's `tokenizer` is a PixtralProcessor, which transformers only builds with
    # torchvision installed. Its text half is all the pipeline uses (no prompt upsampling), so
    # the tokenizer in that folder is loaded instead (`from_diffusers`).
    loader_overrides: ClassVar[dict[str, Any]] = {"tokenizer": None}
    takes_negative_prompt: ClassVar[bool] = False
    takes_image: ClassVar[bool] = True  # reference images, optional

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor

        super().__init__(components, device, dtype, configs)
        self.image_processor = Flux2ImageProcessor(vae_scale_factor=self.multiple_of)

    @classmethod
    def from_diffusers(cls, pipe: Any, path: str, configs: CheckpointConfigs, device: torch.device | str,
                       dtype: torch.dtype) -> "Flux2":
        from transformers import AutoTokenizer

        components = {**pipe.components, "tokenizer": AutoTokenizer.from_pretrained(path, subfolder="tokenizer")}
        return cls(components, device, dtype, configs)

    def configure(self, configs: CheckpointConfigs) -> None:
        self.vae_scale_factor = 2 ** (len(configs.vae.block_out_channels) - 1)
        # Latents are cut into 2x2 patches, so pixel sizes must divide by twice the VAE factor.
        self.multiple_of = self.vae_scale_factor * 2
        self.default_side = self.default_sample_size * self.vae_scale_factor

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        for image in request.images:  # any number of reference images, or none
            width, height = image.size
            if min(width, height) < MIN_IMAGE_SIDE:
                raise RequestError("image", f"image: each input image must be at least {MIN_IMAGE_SIDE}px on both sides, "
                                   f"got {width}x{height}")
            if max(width / height, height / width) > MAX_ASPECT_RATIO:
                raise RequestError("image", f"image: aspect ratio of {width}x{height} is beyond {MAX_ASPECT_RATIO}:1")
        check_divisible(request.params, height=self.multiple_of, width=self.multiple_of)
        if request.params.negative_prompt is not None and not self.takes_negative_prompt:
            raise RequestError("negative_prompt", "negative_prompt: this model is guidance-distilled and runs no negative-prompt pass")

    def prepare_request(self, request: DiffusionRequest) -> DiffusionRequest:
        request = super().prepare_request(request)
        params = request.params
        if params.height is None or params.width is None:
            # As diffusers: the first reference image's condition size, else the default size.
            width = height = self.default_side
            if request.images:
                _, width, height = self.condition_image(request.images[0])
            size = {"height": params.height or height, "width": params.width or width}
            request = dataclasses.replace(request, params=params.model_copy(update=size))
        return request

    def condition_image(self, image: Any) -> tuple[Any, int, int]:
        """(image, width, height) a reference image is encoded at: scaled down to MAX_IMAGE_AREA
        when larger, then cropped to the size multiple (Flux2Pipeline.__call__, step 4)."""
        if image.size[0] * image.size[1] > MAX_IMAGE_AREA:
            image = self.image_processor._resize_to_target_area(image, MAX_IMAGE_AREA)
        width, height = image.size
        return image, width // self.multiple_of * self.multiple_of, height // self.multiple_of * self.multiple_of

    # -- 2. encode: prompts, reference images, initial noise, timesteps ----------------------

    def _chat_texts(self, prompts: list[str]) -> list[str]:
        """FLUX.2-dev's conversation per prompt: its system message, then the prompt (diffusers'
        `format_input`, which drops [IMG] markers from the text)."""
        from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

        conversations = [[{"role": "system", "content": [{"type": "text", "text": SYSTEM_MESSAGE}]},
                          {"role": "user", "content": [{"type": "text", "text": p.replace("[IMG]", "")}]}]
                         for p in prompts]
        return self.tokenizer.apply_chat_template(conversations, add_generation_prompt=False, tokenize=False)

    def _tokenize(self, texts: list[str], max_sequence_length: int) -> dict[str, torch.Tensor]:
        # The PixtralProcessor's text path: the rendered template already starts with the bos
        # token, so none is added again.
        add_special = not (self.tokenizer.bos_token and texts[0].startswith(self.tokenizer.bos_token))
        return self.tokenizer(texts, padding="max_length", truncation=True, max_length=max_sequence_length,
                              add_special_tokens=add_special, return_tensors="pt")

    def _encode_prompts(self, prompts: list[str], max_sequence_length: int) -> torch.Tensor:
        """[N, max_sequence_length, layers * D]: the encoder's hidden states of
        `text_encoder_out_layers` side by side for N prompts. Every prompt is padded to
        max_sequence_length, so its embedding is the same in a batch as alone."""
        tokens = self._tokenize(self._chat_texts(prompts), max_sequence_length)
        output = self.text_encoder(input_ids=tokens["input_ids"].to(self.device),
                                   attention_mask=tokens["attention_mask"].to(self.device),
                                   output_hidden_states=True, use_cache=False)
        out = torch.stack([output.hidden_states[k] for k in self.text_encoder_out_layers], dim=1)
        batch, layers, length, dim = out.shape
        return out.to(self.dtype).permute(0, 2, 1, 3).reshape(batch, length, layers * dim)

    def uses_cfg(self, request: DiffusionRequest) -> bool:
        return False  # guidance-distilled: no negative-prompt pass

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        embeds = encode_prompts_by_length(requests, uses_cfg=self.uses_cfg, encode=self._encode_prompts)
        return [self._initial_state(r, prompt, negative) for r, (prompt, negative) in zip(requests, embeds)]

    def _initial_state(self, request: DiffusionRequest, prompt: torch.Tensor,
                       negative: torch.Tensor | None) -> DenoiseState:
        from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline, compute_empirical_mu, retrieve_timesteps
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        n = params.num_outputs_per_prompt
        # Noise is drawn already patchified, [n, C*4, H/2, W/2], from the request's own
        # generator, exactly as diffusers draws it for num_images_per_prompt=n.
        shape = (n, self.transformer.config.in_channels, params.height // self.multiple_of,
                 params.width // self.multiple_of)
        latents = randn_tensor(shape, generator=self.generator_for(request), device=self.device, dtype=prompt.dtype)
        latent_ids = Flux2Pipeline._prepare_latent_ids(latents).to(self.device)
        latents = latents.flatten(2).transpose(1, 2)  # [n, H/2 * W/2 tokens, C*4]

        noise_scheduler = self.noise_scheduler_copy()
        num_steps = params.num_inference_steps
        mu = compute_empirical_mu(image_seq_len=latents.shape[1], num_steps=num_steps)
        timesteps, _ = retrieve_timesteps(noise_scheduler, num_steps, self.device,
                                          sigmas=flow_sigmas(noise_scheduler, num_steps), mu=mu)
        noise_scheduler.set_begin_index(0)

        cond: dict[str, Any] = {
            "prompt_embeds": repeat_per_output(prompt, n),
            "negative_prompt_embeds": repeat_per_output(negative, n),
            # Text tokens sit at (0, 0, 0, l); image tokens at (0, row, col, 0).
            "text_ids": Flux2Pipeline._prepare_text_ids(prompt.unsqueeze(0)).to(self.device),
            "latent_ids": latent_ids[:1],
            "guidance_scale": params.guidance_scale,
        }
        if request.images:
            cond.update(self._reference_latents(request.images, n, prompt.dtype))
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler, timesteps=timesteps, cond=cond)

    def _reference_latents(self, images: list[Any], n: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The reference images' normalised, patchified VAE latents as tokens [n, tokens, C*4]
        and their position ids, image i at time coordinate 10 * (i + 1)
        (Flux2Pipeline.prepare_image_latents)."""
        from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline

        latents = []
        for image in images:
            image, width, height = self.condition_image(image)
            pixels = self.image_processor.preprocess(image, height=height, width=width, resize_mode="crop")
            encoded = self.vae.encode(pixels.to(self.device, self.vae.dtype)).latent_dist.mode()
            mean, std = self._latents_stats(encoded)
            latents.append((Flux2Pipeline._patchify_latents(encoded) - mean) / std)
        ids = Flux2Pipeline._prepare_image_ids(latents).to(self.device)
        tokens = torch.cat([latent.flatten(2).transpose(1, 2) for latent in latents], dim=1)
        return {"image_latents": tokens.to(dtype).expand(n, -1, -1), "image_latent_ids": ids}

    def _latents_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's batch-norm mean and std of the patchified latents, shaped [1, C*4, 1, 1]."""
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(like.device, like.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps).to(like.device, like.dtype)
        return mean, std

    # -- 3. denoise -----------------------------------------------------------------------

    # FLUX.2-dev is guidance-distilled: no uncond branch ever runs (klein overrides this).
    guidance: ClassVar[Guidance] = Guidance(scale=lambda s: None, combine=plain_cfg)

    # Step caches wrap the single-stream blocks, over the joined text and image tokens (the
    # dual-stream blocks before them, 8 of FLUX.2-dev's 56, always run). No TeaCache
    # coefficients are published for FLUX.2: distances are used as they are.
    step_cache_blocks: ClassVar[BlockChain] = BlockChain(
        blocks=("single_transformer_blocks",),
        io="single_stream",
        modulated_input=lambda block, args, kwargs: flux2_modulated_input(block, kwargs),
        # Each rank joins its chunk of the text tokens and its chunk of the image tokens.
        split_tokens=("text tokens", "image tokens"),
    )

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # Position ids are shared across a transformer call, so its states need the same latent
        # grid, prompt length and reference-image layout.
        def key(s: DenoiseState) -> tuple:
            image_ids = s.cond.get("image_latent_ids")
            return (*grid_and_prompt_length(s), None if image_ids is None else tuple(image_ids.flatten().tolist()))

        self.guided_steps(states, key, self._predict)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """The transformer's prediction for one branch's rows, one per state; timesteps and
        guidance are per sample. Reference-image tokens follow the noisy ones and are cut off."""
        states = [s for s, _ in rows]
        branch = rows[0][1]
        first = states[0].cond
        embeds = "prompt_embeds" if branch == "cond" else "negative_prompt_embeds"
        latents = torch.cat([s.latents for s in states])
        hidden, img_ids = latents, first["latent_ids"]
        if "image_latents" in first:
            hidden = torch.cat([latents, torch.cat([s.cond["image_latents"] for s in states])], dim=1)
            img_ids = torch.cat([img_ids, first["image_latent_ids"]], dim=1)
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.cat([torch.full((s.latents.shape[0],), s.cond["guidance_scale"], device=self.device,
                                             dtype=torch.float32) for s in states])
        with self.transformer.cache_context(branch):
            noise_pred = self.transformer(
                hidden_states=hidden.to(self.transformer.dtype),
                timestep=current_timesteps(states).to(latents.dtype) / 1000,
                guidance=guidance,
                encoder_hidden_states=torch.cat([s.cond[embeds] for s in states]),
                txt_ids=first["text_ids"],
                img_ids=img_ids,
                return_dict=False,
            )[0]
        return split_per_state(noise_pred[:, : latents.shape[1]], states)

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # States with the same image size share one VAE call.
        return map_groups(states, image_size, self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline

        params = states[0].request.params
        tokens = torch.cat([s.latents for s in states])
        # Tokens are in row-major grid order: back to [B, C*4, H/2, W/2], undo the batch norm.
        latents = tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], params.height // self.multiple_of,
                                                 params.width // self.multiple_of)
        mean, std = self._latents_stats(latents)
        latents = Flux2Pipeline._unpatchify_latents(latents * std + mean)
        images = self.vae_decode(latents.to(self.vae.dtype))
        return split_per_state(self.image_processor.postprocess(images, output_type="np"), states)


def flux2_modulated_input(block: Any, kwargs: dict) -> torch.Tensor:
    """TeaCache's input: the first single-stream block's normed, timestep-modulated tokens."""
    from diffusers.models.transformers.transformer_flux2 import Flux2Modulation

    shift, scale, _ = Flux2Modulation.split(kwargs["temb_mod"], 1)[0]
    return (1 + scale) * block.norm(kwargs["hidden_states"]) + shift
