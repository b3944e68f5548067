"""HunyuanVideo-1.5 text- and image-to-video: Qwen2.5-VL + ByT5 text encoders (+ SigLIP for the
image), a dual-stream 3D DiT and the 16x / 4x compressing causal VAE.

Reproduces `diffusers.HunyuanVideo15Pipeline` (pipelines/hunyuan_video1_5/
pipeline_hunyuan_video1_5.py) as `HunyuanVideo15T2V` and `HunyuanVideo15ImageToVideoPipeline`
(pipeline_hunyuan_video1_5_image2video.py) as `HunyuanVideo15I2V`, split at the encode /
denoise_step / decode seams. What the checkpoint decides, read from its configs as diffusers does:

- The CFG rule is the `guider` component (`ClassifierFreeGuidance`): its guidance_scale is
  the default (diffusers' `__call__` takes none; a request may set its own), and its
  formulation, rescale and start / stop step fractions apply to every request.
- The default size is the transformer's `target_size` bucket closest to 16:9 (image-to-video:
  closest to the image's aspect ratio), as in diffusers.

Every prompt is padded to the same lengths (1000 Qwen tokens, 256 ByT5 bytes) and the
transformer masks the padding, so requests of any prompt share a transformer call when their
latent shapes match.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.accel.step_cache import BlockChain
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_divisible,
    check_one_image,
    check_video_frames,
    encode_prompt_pairs,
    latent_shape,
    split_per_state,
)
from omnistage.core.errors import RequestError
from omnistage.diffusion.accel.declaration import Accelerations

# HunyuanVideo15Pipeline's fixed prompt lengths and image-embedding slots (set in its __init__).
TOKENIZER_MAX_LENGTH = 1000
PROMPT_TEMPLATE_CROP = 108  # the system message's tokens, dropped from the encoder's output
TOKENIZER_2_MAX_LENGTH = 256
VISION_NUM_SEMANTIC_TOKENS = 729
DEFAULT_ASPECT_RATIO = (16, 9)  # width : height of the default size


def _guided_scale(state: DenoiseState) -> float | None:
    """This step's CFG scale, or None when the uncond branch does not run: CFG off for the
    request, or the step outside the guider's [start, stop) fraction of the steps."""
    if state.cond["negative_prompt_embeds"] is None:
        return None
    start, stop = state.cond["cfg_window"]
    return state.cond["guidance_scale"] if start <= state.step_index < stop else None


def _guider_combine(state: DenoiseState, cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """ClassifierFreeGuidance.forward: from uncond (or, in the original formulation, from cond)
    by scale * (cond - uncond), then optionally rescaled toward the cond prediction's std."""
    from diffusers.guiders.guider_utils import rescale_noise_cfg

    pred = (cond if state.cond["original_formulation"] else uncond) + scale * (cond - uncond)
    rescale = state.cond["guidance_rescale"]
    return rescale_noise_cfg(pred, cond, rescale) if rescale > 0.0 else pred


class HunyuanVideo15T2V(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "HunyuanVideo15Pipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        step_caches=("first_block_cache", "tea_cache", "easycache"), cfg_parallel=True, fsdp=True, vae_tiling=True, offload=True, quantization=True, compile=True)
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->vae"
    output_modality: ClassVar[str] = "video"
    # HunyuanVideo15Pipeline.__call__ defaults; the size and guidance_scale come from the
    # checkpoint (configure). HunyuanVideo-1.5 makes 24 fps video: 121 frames are 5 seconds.
    default_params: ClassVar[dict[str, Any]] = {
        "num_frames": 121,
        "fps": 24,
        "num_inference_steps": 50,
    }
    # Each CFG branch is its own transformer call, as in diffusers.
    guidance: ClassVar[Guidance] = Guidance(scale=_guided_scale, combine=_guider_combine)

    # Step caches wrap the dual-stream blocks, which take everything positionally.
    # TeaCache publishes no coefficients for HunyuanVideo-1.5: no rescaling.
    step_cache_blocks: ClassVar[BlockChain] = BlockChain(
        blocks=("transformer_blocks",),
        io="positional_pair",
        modulated_input=lambda block, args, kwargs: hunyuan_video_modulated_input(block, args),
    )

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

        super().__init__(components, device, dtype, configs)
        self.video_processor = HunyuanVideo15ImageProcessor(vae_scale_factor=self.vae_scale_factor_spatial)

    def configure(self, configs: CheckpointConfigs) -> None:
        from diffusers.pipelines.hunyuan_video1_5.image_processor import generate_crop_size_list, get_closest_ratio

        vae, transformer, guider = configs.vae, configs.transformer, configs.guider
        self.vae_scale_factor_spatial = vae.get("spatial_compression_ratio", 16)
        self.vae_scale_factor_temporal = vae.get("temporal_compression_ratio", 4)
        self.num_channels_latents = vae.get("latent_channels", 32)
        self.scaling_factor = vae.get("scaling_factor", 1.03682)
        self.patch_size = transformer.get("patch_size", 1)
        self.patch_size_t = transformer.get("patch_size_t", 1)
        self.image_embed_dim = transformer.get("image_embed_dim", 1152)
        # diffusers floors sizes to whole latents; we refuse what is not a whole patch of them.
        self.multiple_of = self.vae_scale_factor_spatial * self.patch_size
        # ClassifierFreeGuidance's defaults where the guider config leaves a key out.
        self.guider_scale = guider.get("guidance_scale", 7.5) if guider.get("enabled", True) else 1.0
        self.guidance_rescale = guider.get("guidance_rescale", 0.0)
        self.original_formulation = bool(guider.get("use_original_formulation", False))
        self.cfg_start, self.cfg_stop = guider.get("start", 0.0), guider.get("stop", 1.0)
        # HunyuanVideo15ImageProcessor.calculate_default_height_width over the target size's buckets.
        buckets = generate_crop_size_list(base_size=transformer.get("target_size", 640),
                                          patch_size=self.vae_scale_factor_spatial)
        ratios = np.array([round(float(h) / float(w), 5) for h, w in buckets])
        height, width = get_closest_ratio(DEFAULT_ASPECT_RATIO[1], DEFAULT_ASPECT_RATIO[0], ratios, buckets)[0]
        self.default_params = {**type(self).default_params, "height": int(height), "width": int(width),
                               "guidance_scale": self.guider_scale}

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params
        check_divisible(params, height=self.multiple_of, width=self.multiple_of)
        check_video_frames(params, self.vae_scale_factor_temporal)
        num_latent_frames = (params.num_frames - 1) // self.vae_scale_factor_temporal + 1
        if num_latent_frames % self.patch_size_t != 0:
            raise RequestError("num_frames", f"num_frames gives {num_latent_frames} latent frames, not a multiple of the "
                               f"transformer's temporal patch {self.patch_size_t}")
        for name in ("true_cfg_scale", "guidance_scale_2"):
            if getattr(params, name) is not None:
                raise RequestError(name, f"{name}: not used by HunyuanVideo-1.5 (its CFG scale is guidance_scale)")

    def _uses_cfg(self, request: DiffusionRequest) -> bool:
        """ClassifierFreeGuidance skips the uncond branch at scale 1 (0 in the original formulation)."""
        return not math.isclose(request.params.guidance_scale, 0.0 if self.original_formulation else 1.0)

    # -- 2. encode: prompts, initial noise, timesteps -------------------------------------

    def _encode_texts(self, texts: list[str]) -> list[tuple[torch.Tensor, ...]]:
        """(Qwen embeds, mask, ByT5 embeds, mask) rows per text, each [1, ...], all texts in one
        call per encoder (HunyuanVideo15Pipeline.encode_prompt; its helpers pad every text to
        the fixed lengths, so rows do not depend on the batch)."""
        from diffusers import HunyuanVideo15Pipeline

        # The static helpers' default system message is the one the pipeline's __init__ sets.
        embeds, mask = HunyuanVideo15Pipeline._get_mllm_prompt_embeds(
            text_encoder=self.text_encoder, tokenizer=self.tokenizer, prompt=texts, device=self.device,
            tokenizer_max_length=TOKENIZER_MAX_LENGTH, crop_start=PROMPT_TEMPLATE_CROP)
        embeds_2, mask_2 = HunyuanVideo15Pipeline._get_byt5_prompt_embeds(
            tokenizer=self.tokenizer_2, text_encoder=self.text_encoder_2, prompt=texts, device=self.device,
            tokenizer_max_length=TOKENIZER_2_MAX_LENGTH)
        dtype = self.transformer.dtype
        return list(zip(*(t.to(dtype).split(1) for t in (embeds, mask, embeds_2, mask_2))))

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        embeds = encode_prompt_pairs(requests, uses_cfg=self._uses_cfg, encode=self._encode_texts)
        return [self._initial_state(r, prompt, negative) for r, (prompt, negative) in zip(requests, embeds)]

    def _initial_state(self, request: DiffusionRequest, prompt: tuple[torch.Tensor, ...],
                       negative: tuple[torch.Tensor, ...] | None) -> DenoiseState:
        from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import retrieve_timesteps
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        height, width = self._video_size(request)
        num_latent_frames = (params.num_frames - 1) // self.vae_scale_factor_temporal + 1
        shape = (1, self.num_channels_latents, num_latent_frames, height // self.vae_scale_factor_spatial,
                 width // self.vae_scale_factor_spatial)
        latents = randn_tensor(shape, generator=self.generator_for(request), device=self.device,
                               dtype=self.transformer.dtype)

        steps = params.num_inference_steps
        noise_scheduler = self.noise_scheduler_copy()
        timesteps, _ = retrieve_timesteps(noise_scheduler, steps, self.device, sigmas=np.linspace(1.0, 0.0, steps + 1)[:-1])
        noise_scheduler.set_begin_index(0)

        names = ("prompt_embeds", "prompt_embeds_mask", "prompt_embeds_2", "prompt_embeds_mask_2")
        cond: dict[str, Any] = dict(zip(names, prompt))
        cond.update(zip((f"negative_{n}" for n in names), negative or (None,) * len(names)))
        cond.update(self._image_condition(request, latents, height, width))
        cond.update(
            guidance_scale=params.guidance_scale,
            # ClassifierFreeGuidance._is_cfg_enabled: the steps [int(start * n), int(stop * n)).
            cfg_window=(int(self.cfg_start * steps), int(self.cfg_stop * steps)),
            guidance_rescale=self.guidance_rescale,
            original_formulation=self.original_formulation,
        )
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler, timesteps=timesteps, cond=cond)

    def _video_size(self, request: DiffusionRequest) -> tuple[int, int]:
        """(height, width) in pixels of the request's video."""
        return request.params.height, request.params.width

    def _image_condition(self, request: DiffusionRequest, latents: torch.Tensor, height: int,
                         width: int) -> dict[str, torch.Tensor | None]:
        """What the transformer is conditioned on besides the text: the latents (and their mask
        channel) concatenated to the noise, and the image embeddings. Text-to-video: none
        (zeros at call time)."""
        return {"condition": None, "image_embeds": None}

    # -- 3. denoise -----------------------------------------------------------------------

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # Prompt lengths are fixed, so one transformer call needs only equal latent shapes.
        self.guided_steps(states, latent_shape, self._predict)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """The transformer over one branch's rows: the noise next to the condition latents and
        mask, and the image embeddings; text-to-video gives zeros for both (the transformer masks
        all-zero image embeddings out)."""
        states = [s for s, _ in rows]
        branch = rows[0][1]
        prefix = "" if branch == "cond" else "negative_"
        latents = torch.cat([s.latents for s in states])
        b, c, f, h, w = latents.shape
        dtype = self.transformer.dtype
        if states[0].cond["condition"] is None:
            condition = latents.new_zeros(b, c + 1, f, h, w, dtype=dtype)
            image_embeds = torch.zeros(b, VISION_NUM_SEMANTIC_TOKENS, self.image_embed_dim, dtype=dtype,
                                       device=self.device)
        else:
            condition = torch.cat([s.cond["condition"] for s in states])
            image_embeds = torch.cat([s.cond["image_embeds"] for s in states])
        model_input = torch.cat([latents, condition], dim=1)

        def cat(name: str) -> torch.Tensor:
            return torch.cat([s.cond[prefix + name] for s in states])

        with self.transformer.cache_context(branch):
            noise_pred = self.transformer(
                hidden_states=model_input,
                image_embeds=image_embeds,
                timestep=torch.cat([s.timesteps[s.step_index].expand(1) for s in states]).to(model_input.dtype),
                timestep_r=self._timestep_r(states, model_input.dtype),
                encoder_hidden_states=cat("prompt_embeds"),
                encoder_attention_mask=cat("prompt_embeds_mask"),
                encoder_hidden_states_2=cat("prompt_embeds_2"),
                encoder_attention_mask_2=cat("prompt_embeds_mask_2"),
                return_dict=False,
            )[0]
        return split_per_state(noise_pred, states)

    def _timestep_r(self, states: list[DenoiseState], dtype: torch.dtype) -> torch.Tensor | None:
        """The MeanFlow target timestep (the next one; 0 after the last): only the
        image-to-video pipeline passes it, for transformers with use_meanflow."""
        return None

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # One video per VAE call: the VAE's mid-block attention builds its causal mask as
        # [batch, tokens, tokens], which SDPA reads as [heads, ...], so a batch of two fails.
        return [self._decode(state) for state in states]

    def _decode(self, state: DenoiseState) -> np.ndarray:
        video = self.vae_decode(state.latents.to(self.vae.dtype) / self.scaling_factor)
        return self.video_processor.postprocess_video(video, output_type="np")[0]  # [F, H, W, 3]


class HunyuanVideo15I2V(HunyuanVideo15T2V):
    """HunyuanVideo15ImageToVideoPipeline: the input image fixes the first latent frame
    (VAE-encoded, concatenated to the noise behind a mask) and the transformer attends to its
    SigLIP features. The video takes the image's aspect ratio: the target size's bucket closest
    to it, the image resized and center-cropped to that bucket, as in diffusers."""

    reference_class: ClassVar[str] = "HunyuanVideo15ImageToVideoPipeline"
    model_cpu_offload_seq: ClassVar[str] = "image_encoder->text_encoder->transformer->vae"
    needs_image: ClassVar[bool] = True

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

        super().__init__(components, device, dtype, configs)
        # The image is resized to its bucket before preprocessing, which then only normalizes.
        self.video_processor = HunyuanVideo15ImageProcessor(vae_scale_factor=self.vae_scale_factor_spatial,
                                                            do_resize=False, do_convert_rgb=True)

    def configure(self, configs: CheckpointConfigs) -> None:
        super().configure(configs)
        self.target_size = configs.transformer.get("target_size", 640)
        self.use_meanflow = bool(configs.transformer.get("use_meanflow", False))
        # The size comes from the input image, never from a default.
        self.default_params = {k: v for k, v in self.default_params.items() if k not in ("height", "width")}

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        check_one_image(request)
        for name in ("height", "width"):
            if getattr(request.params, name) is not None:
                raise RequestError(name, f"{name}: the video takes the input image's aspect ratio at the model's target "
                                   f"size ({self.target_size}); leave height and width unset")

    def _video_size(self, request: DiffusionRequest) -> tuple[int, int]:
        """HunyuanVideo15ImageProcessor.calculate_default_height_width for the image's aspect ratio."""
        from diffusers.pipelines.hunyuan_video1_5.image_processor import generate_crop_size_list, get_closest_ratio

        image = request.images[0]
        buckets = generate_crop_size_list(base_size=self.target_size, patch_size=self.vae_scale_factor_spatial)
        ratios = np.array([round(float(h) / float(w), 5) for h, w in buckets])
        height, width = get_closest_ratio(image.size[1], image.size[0], ratios, buckets)[0]
        return int(height), int(width)

    def _image_condition(self, request: DiffusionRequest, latents: torch.Tensor, height: int,
                         width: int) -> dict[str, torch.Tensor | None]:
        """HunyuanVideo15ImageToVideoPipeline's encode_image and prepare_cond_latents_and_mask:
        SigLIP's last hidden states of the cropped image, and its VAE latents in the first
        latent frame (zeros after it) with a mask channel that is 1 on that frame."""
        from diffusers import HunyuanVideo15ImageToVideoPipeline as Reference

        image = self.video_processor.resize(request.images[0], height=height, width=width, resize_mode="crop")
        dtype = self.transformer.dtype
        embeds = Reference._get_image_embeds(image_encoder=self.image_encoder, feature_extractor=self.feature_extractor,
                                             image=image, device=self.device)
        image_latents = Reference._get_image_latents(vae=self.vae, image_processor=self.video_processor, image=image,
                                                     height=height, width=width, device=self.device)
        condition = torch.zeros_like(latents)
        condition[:, :, :1] = image_latents.to(dtype)
        mask = torch.zeros_like(latents[:, :1])
        mask[:, :, 0] = 1.0
        return {"condition": torch.cat([condition, mask], dim=1), "image_embeds": embeds.to(dtype)}

    def _timestep_r(self, states: list[DenoiseState], dtype: torch.dtype) -> torch.Tensor | None:
        if not self.use_meanflow:
            return None
        zero = torch.zeros(1, device=self.device)
        return torch.cat([s.timesteps[s.step_index + 1].expand(1) if s.step_index + 1 < s.num_steps else zero
                          for s in states]).to(dtype)


def hunyuan_video_modulated_input(block: Any, args: tuple) -> torch.Tensor:
    """TeaCache's input: the first block's normed video tokens, shifted and scaled by its
    timestep modulation (HunyuanVideo15TransformerBlock's attention input; args are
    (hidden_states, encoder_hidden_states, temb, ...))."""
    normed, *_ = block.norm1(args[0], emb=args[2])
    return normed
