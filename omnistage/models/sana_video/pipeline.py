"""SANA-Video text- and image-to-video: a Gemma 2 text model, a linear-attention 3D DiT and the
Wan 2.1 VAE (or LTX-2's, as diffusers allows).

Reproduces `diffusers.SanaVideoPipeline` (pipelines/sana_video/pipeline_sana_video.py) as
`SanaVideoT2V` and `SanaImageToVideoPipeline` (pipeline_sana_video_i2v.py) as `SanaVideoI2V`,
split at the encode / denoise_step / decode seams. The two differ only in the first latent frame:
I2V pins it to the VAE-encoded image, gives its tokens timestep 0 and steps the scheduler over
the other frames.

- Prompts get diffusers' default complex human instruction in front; the encoder output keeps
  the first token and the last `max_sequence_length - 1` (SANA's "select index"). Negative
  prompts get neither. Every text is padded to a fixed length, so rows never depend on the batch.
- `use_resolution_binning` (diffusers' default where the checkpoint has bins: transformer
  sample_size 30 is 480p, 22 is 720p) generates at the closest bin of the requested aspect
  ratio, then resizes and crops the video back to the requested size.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.accel.declaration import Accelerations
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_one_image,
    check_video_frames,
    map_groups,
    split_per_state,
)
from omnistage.models.wan.pipeline import latent_stats

# Generation sizes must be whole 32-pixel blocks (SanaVideoPipeline.check_inputs).
SIZE_MULTIPLE = 32


def _guidance_scale(state: DenoiseState) -> float | None:
    return None if state.cond["negative_prompt_embeds"] is None else state.cond["guidance_scale"]


def _bins(sample_size: int | None) -> dict[str, list[float]] | None:
    """diffusers' resolution bins for the transformer's sample_size, or None where it has none."""
    from diffusers.pipelines.sana_video.pipeline_sana_video import ASPECT_RATIO_480_BIN, ASPECT_RATIO_720_BIN

    return {30: ASPECT_RATIO_480_BIN, 22: ASPECT_RATIO_720_BIN}.get(sample_size)


class SanaVideoT2V(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "SanaVideoPipeline"
    # No step-cache block chain is written for its linear-attention blocks.
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        cfg_parallel=True, vae_patch_parallel=True, vae_tiling=True, offload=True, quantization=True, lora=True,
        refused={"ulysses_degree": "its transformer has no sequence-parallel plan",
                 "compile": "its transformer declares no repeated blocks"})
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->vae"
    output_modality: ClassVar[str] = "video"
    # SanaVideoPipeline.__call__ defaults (fps: its examples export at 16).
    default_params: ClassVar[dict[str, Any]] = {
        "height": 480,
        "width": 832,
        "num_frames": 81,
        "fps": 16,
        "num_inference_steps": 50,
        "guidance_scale": 6.0,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, max_from=("tokenizer", "text_encoder"), default=300, min=1,
                                         help="Gemma prompt tokens the transformer attends to (padded to this)."),
    }
    # diffusers batches [uncond, cond] into one transformer call.
    guidance: ClassVar[Guidance] = Guidance(scale=_guidance_scale, combine=plain_cfg, batch_branches=True)

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers import SanaVideoPipeline
        from diffusers.video_processor import VideoProcessor

        super().__init__(components, device, dtype, configs)
        self.video_processor = VideoProcessor(vae_scale_factor=self.vae_scale_factor_spatial)
        # The instruction diffusers' __call__ prefixes every prompt with by default.
        self.complex_human_instruction = inspect.signature(SanaVideoPipeline.__call__).parameters[
            "complex_human_instruction"].default

    def configure(self, configs: CheckpointConfigs) -> None:
        vae, transformer = configs.vae, configs.transformer
        # AutoencoderKLWan names its factors scale_factor_*, LTX-2's VAE *_compression_ratio.
        self.vae_scale_factor_spatial = vae.get("scale_factor_spatial", vae.get("spatial_compression_ratio", 8))
        self.vae_scale_factor_temporal = vae.get("scale_factor_temporal", vae.get("temporal_compression_ratio", 4))
        self.patch_size = tuple(transformer.get("patch_size", (1, 2, 2)))
        self.bins = _bins(transformer.get("sample_size"))
        # Binning on by default, as in diffusers, where the checkpoint has bins to snap to.
        self.extras = {**type(self).extras, "use_resolution_binning": ExtraSpec(
            bool, default=self.bins is not None,
            help="Generate at the closest 480p/720p bin of the aspect ratio, then resize and crop back.")}

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params
        if params.extras["use_resolution_binning"] and self.bins is None:
            raise RequestError("use_resolution_binning", "use_resolution_binning: this checkpoint has no resolution "
                               "bins (transformer sample_size is neither 30 nor 22)")
        height, width = self._generation_size(request)
        for name, value in (("height", height), ("width", width)):
            if value % SIZE_MULTIPLE != 0:
                binned = " (its resolution bin)" if params.extras["use_resolution_binning"] else ""
                raise RequestError(name, f"{name} must be divisible by {SIZE_MULTIPLE}{binned}, got {value}")
        check_video_frames(params, self.vae_scale_factor_temporal)
        for name in ("true_cfg_scale", "guidance_scale_2"):
            if getattr(params, name) is not None:
                raise RequestError(name, f"{name}: not used by SANA-Video (its CFG scale is guidance_scale)")

    def _generation_size(self, request: DiffusionRequest) -> tuple[int, int]:
        """(height, width) the video is generated at: the request's, or its resolution bin."""
        params = request.params
        if not params.extras["use_resolution_binning"]:
            return params.height, params.width
        from diffusers.video_processor import VideoProcessor

        return VideoProcessor.classify_height_width_bin(params.height, params.width, ratios=self.bins)

    # -- 2. encode: prompts, initial noise, timesteps -------------------------------------

    def _encode_texts(self, texts: list[str], max_sequence_length: int, instruct: bool) -> list[tuple[torch.Tensor, ...]]:
        """(embeds, mask) rows [1, max_sequence_length, ...] per text (SanaVideoPipeline.encode_prompt
        with clean_caption off): prompts (`instruct`) behind the complex human instruction, then
        the select index; negative prompts plain."""
        texts = [t.lower().strip() for t in texts]
        max_length = max_sequence_length
        if instruct:
            instruction = "\n".join(self.complex_human_instruction)
            texts = [instruction + t for t in texts]
            max_length = len(self.tokenizer.encode(instruction)) + max_sequence_length - 2
        tokens = self.tokenizer(texts, padding="max_length", max_length=max_length, truncation=True,
                                add_special_tokens=True, return_tensors="pt", padding_side="right")
        mask = tokens.attention_mask.to(self.device)
        embeds = self.text_encoder(tokens.input_ids.to(self.device), attention_mask=mask)[0]
        if instruct:
            select = [0, *range(-max_sequence_length + 1, 0)]
            embeds, mask = embeds[:, select], mask[:, select]
        return list(zip(embeds.split(1), mask.split(1)))

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        prompts: list[Any] = [None] * len(requests)
        negatives: list[Any] = [None] * len(requests)
        # Requests with the same max_sequence_length share one encoder call per kind of text.
        for max_len in sorted({r.params.extras["max_sequence_length"] for r in requests}):
            group = [i for i, r in enumerate(requests) if r.params.extras["max_sequence_length"] == max_len]
            guided = [i for i in group if requests[i].params.guidance_scale > 1.0]
            for i, row in zip(group, self._encode_texts([requests[i].prompt for i in group], max_len, True)):
                prompts[i] = row
            if guided:
                texts = [requests[i].params.negative_prompt or "" for i in guided]
                for i, row in zip(guided, self._encode_texts(texts, max_len, False)):
                    negatives[i] = row
        return [self._initial_state(r, p, n) for r, p, n in zip(requests, prompts, negatives)]

    def _initial_state(self, request: DiffusionRequest, prompt: tuple[torch.Tensor, ...],
                       negative: tuple[torch.Tensor, ...] | None) -> DenoiseState:
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        height, width = self._generation_size(request)
        num_latent_frames = (params.num_frames - 1) // self.vae_scale_factor_temporal + 1
        shape = (1, self.transformer.config.in_channels, num_latent_frames,
                 height // self.vae_scale_factor_spatial, width // self.vae_scale_factor_spatial)
        # Latents (and the noise scheduler's arithmetic) stay in float32 whatever the model dtype.
        latents = randn_tensor(shape, generator=self.generator_for(request), device=self.device, dtype=torch.float32)
        noise_scheduler = self.noise_scheduler_copy()
        noise_scheduler.set_timesteps(params.num_inference_steps, device=self.device)
        cond = {
            "prompt_embeds": prompt[0], "prompt_embeds_mask": prompt[1],
            "negative_prompt_embeds": None if negative is None else negative[0],
            "negative_prompt_embeds_mask": None if negative is None else negative[1],
            "guidance_scale": params.guidance_scale,
        }
        state = DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler,
                             timesteps=noise_scheduler.timesteps, cond=cond)
        self._condition(state, height, width)
        return state

    def _condition(self, state: DenoiseState, height: int, width: int) -> None:
        """Image-to-video pins the first latent frame here; text-to-video has nothing to add."""

    # -- 3. denoise -----------------------------------------------------------------------

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # One transformer call needs equal latent shapes and prompt lengths.
        def key(s: DenoiseState) -> tuple:
            return tuple(s.latents.shape[1:]), s.cond["prompt_embeds"].shape[1]

        self.guided_steps(states, key, self._predict, self._step)

    def _timestep(self, state: DenoiseState) -> torch.Tensor:
        """[1]: one timestep per sample (image-to-video: one per latent token)."""
        return state.timesteps[state.step_index].expand(1)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        states = [s for s, _ in rows]
        prefix = ["" if branch == "cond" else "negative_" for _, branch in rows]
        dtype = self.transformer.dtype
        noise_pred = self.transformer(
            torch.cat([s.latents for s in states]).to(dtype),
            encoder_hidden_states=torch.cat([s.cond[p + "prompt_embeds"] for s, p in zip(states, prefix)]).to(dtype),
            encoder_attention_mask=torch.cat([s.cond[p + "prompt_embeds_mask"] for s, p in zip(states, prefix)]),
            timestep=torch.cat([self._timestep(s) for s in states]),
            return_dict=False,
        )[0].float()
        # A transformer that also predicts the variance ("learned sigma") doubles its channels.
        if self.transformer.config.out_channels // 2 == self.transformer.config.in_channels:
            noise_pred = noise_pred.chunk(2, dim=1)[0]
        return split_per_state(noise_pred, states)

    def _step(self, state: DenoiseState, noise_pred: torch.Tensor) -> None:
        self.noise_scheduler_step(state, noise_pred)

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # States with the same latent shape and output size share one VAE call.
        def key(s: DenoiseState) -> tuple:
            return tuple(s.latents.shape[1:]), s.request.params.height, s.request.params.width

        return map_groups(states, key, self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        latents = torch.cat([s.latents for s in states]).to(self.vae.dtype)
        mean, inv_std = latent_stats(self.vae, latents.shape[1], self.device, self.vae.dtype)
        video = self.vae_decode(latents / inv_std + mean)
        params = states[0].request.params
        if params.extras["use_resolution_binning"]:
            video = self.video_processor.resize_and_crop_tensor(video, params.width, params.height)
        return list(self.video_processor.postprocess_video(video, output_type="np"))  # [F, H, W, 3] each


class SanaVideoI2V(SanaVideoT2V):
    """SanaImageToVideoPipeline: the image, VAE-encoded at the generation size, is the first
    latent frame; its tokens get timestep 0 and the scheduler steps only the frames after it."""

    reference_class: ClassVar[str] = "SanaImageToVideoPipeline"
    needs_image: ClassVar[bool] = True

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        check_one_image(request)

    def _condition(self, state: DenoiseState, height: int, width: int) -> None:
        """SanaImageToVideoPipeline.prepare_latents and its conditioning mask (1 on the first
        latent frame's tokens)."""
        from diffusers.pipelines.sana_video.pipeline_sana_video_i2v import retrieve_latents

        image = self.video_processor.preprocess(state.request.images[0], height=height, width=width)
        image = image.to(self.device, dtype=torch.float32).unsqueeze(2).to(self.vae.dtype)  # [1, 3, 1, H, W]
        encoded = retrieve_latents(self.vae_encode(image), sample_mode="argmax")
        mean, inv_std = latent_stats(self.vae, encoded.shape[1], self.device, encoded.dtype)
        state.latents[:, :, :1] = ((encoded - mean) * inv_std).to(state.latents.dtype)
        p_t, p_h, p_w = self.patch_size
        _, _, frames, h, w = state.latents.shape
        mask = state.latents.new_zeros(1, 1, frames // p_t, h // p_h, w // p_w)
        mask[:, :, 0] = 1.0
        state.cond["conditioning_mask"] = mask

    def _timestep(self, state: DenoiseState) -> torch.Tensor:
        mask = state.cond["conditioning_mask"]
        return state.timesteps[state.step_index].expand(mask.shape) * (1 - mask)

    def _step(self, state: DenoiseState, noise_pred: torch.Tensor) -> None:
        # Only the frames after the image are denoised.
        t = state.timesteps[state.step_index]
        rest = state.noise_scheduler.step(noise_pred[:, :, 1:], t, state.latents[:, :, 1:], return_dict=False)[0]
        state.latents = torch.cat([state.latents[:, :, :1], rest], dim=2)
        state.step_index += 1
