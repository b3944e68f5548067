"""Cosmos3 text-, image- and video-to-video: one packed mixture-of-transformers that reads the
prompt's token ids and the video latents in one sequence (causal text, full attention for the
video tokens over both), and the Wan 2.2 VAE.

Reproduces `diffusers.Cosmos3OmniPipeline` (pipelines/cosmos/pipeline_cosmos3_omni.py) for
video (and, with `num_frames=1`, an image as a one-frame video), split at the encode /
denoise_step / decode seams.

- The prompt gets Cosmos3's system prompt and its duration and resolution sentences; the
  negative prompt the inverse sentences. Tokenizing, packing the sequence (text, then video
  tokens, with 3D mRoPE positions) and the conditioning latents are the diffusers pipeline's
  own methods (`recipe`, built over our components), so they cannot drift from it.
- Image-to-video pins latent frame 0 to the VAE-encoded image (repeated over the clip, as
  diffusers encodes it); video-to-video pins the latent frames `condition_frame_indexes_vision`
  of the clip's first (or last) frames. Pinned frames get no timestep embedding and a zero
  velocity, so the scheduler leaves them as they are.
- The transformer packs one sample per call (its causal text prefix is a single sequence), so
  each request and CFG branch is its own call; batching shares the step, not the call.
- Not served: sound (`enable_sound`, a sound tokenizer), action-conditioned runs (`action`), the
  Cosmos guardrail (`cosmos_guardrail` is not a dependency) and FP8 mixed precision.
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
    check_divisible,
    check_video_frames,
    map_groups,
)
from omnistage.models.wan.pipeline import latent_stats

# What the transformer's forward takes from a packed sequence (the rest are packing helpers).
_PACK_INPUTS = ("text_indexes", "position_ids", "und_len", "sequence_length", "vision_token_shapes",
                "vision_sequence_indexes", "vision_mse_loss_indexes", "vision_noisy_frame_indexes")


def _call_default(name: str) -> Any:
    from diffusers import Cosmos3OmniPipeline

    return inspect.signature(Cosmos3OmniPipeline.__call__).parameters[name].default


def _guidance_scale(state: DenoiseState) -> float | None:
    # diffusers runs the unconditional pass whenever the scale is not 1.
    return None if state.cond["uncond"] is None else state.cond["guidance_scale"]


class Cosmos3(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "Cosmos3OmniPipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        vae_tiling=True, offload=True, quantization=True, compile=True,
        refused={"cache_backend": "no step-cache block chain is written for its packed text + video layers",
                 "ulysses_degree": "its packed sequence has no sequence-parallel plan here",
                 "cfg_parallel_size": "its CFG branches are packed sequences of different lengths, one call each",
                 "lora": "diffusers' Cosmos3OmniPipeline has no LoRA loader"})
    model_cpu_offload_seq: ClassVar[str] = "transformer->vae"
    output_modality: ClassVar[str] = "video"
    takes_image: ClassVar[bool] = True  # the first frame (image-to-video)
    takes_video: ClassVar[bool] = True  # the conditioning clip (video-to-video), without a mask
    # Cosmos3OmniPipeline.__call__ defaults (its body sets 189 frames at 720 x 1280).
    default_params: ClassVar[dict[str, Any]] = {
        "height": 720,
        "width": 1280,
        "num_frames": 189,
        "fps": 24,
        "num_inference_steps": 35,
        "guidance_scale": 6.0,
    }
    guidance: ClassVar[Guidance] = Guidance(scale=_guidance_scale, combine=plain_cfg)

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers import Cosmos3OmniPipeline

        super().__init__(components, device, dtype, configs)
        # diffusers' pipeline over the very same modules: its tokenizing, packing and
        # conditioning methods are the recipe every request is prepared with.
        self.recipe = Cosmos3OmniPipeline(
            transformer=self.transformer, text_tokenizer=self.text_tokenizer, vae=self.vae,
            scheduler=self.noise_scheduler, enable_safety_checker=False,
            default_use_system_prompt=self.default_use_system_prompt,
            use_native_flow_schedule=self.use_native_flow_schedule)

    def configure(self, configs: CheckpointConfigs) -> None:
        self.vae_scale_factor_spatial = configs.vae.get("scale_factor_spatial", 16)
        self.vae_scale_factor_temporal = configs.vae.get("scale_factor_temporal", 4)
        self.default_use_system_prompt = configs.pipeline.get("default_use_system_prompt", True)
        self.use_native_flow_schedule = configs.pipeline.get("use_native_flow_schedule", False)
        self.extras = {
            "use_system_prompt": ExtraSpec(bool, default=self.default_use_system_prompt,
                                           help="Put Cosmos3's system prompt before the prompt."),
            "add_resolution_template": ExtraSpec(bool, default=_call_default("add_resolution_template"),
                                                 help="Append 'This video is of HxW resolution.' to the prompt."),
            "add_duration_template": ExtraSpec(bool, default=_call_default("add_duration_template"),
                                               help="Append the clip's seconds and fps to the prompt."),
            "condition_frame_indexes_vision": ExtraSpec(
                list, default=list(_call_default("condition_frame_indexes_vision")),
                help="Video-to-video: the latent frames pinned to the conditioning clip (4 frames each after "
                     "the first)."),
            "condition_video_keep": ExtraSpec(str, default=_call_default("condition_video_keep"),
                                              choices=("first", "last"),
                                              help="Video-to-video: condition on the clip's first or last frames."),
        }

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params
        check_divisible(params, height=self.vae_scale_factor_spatial, width=self.vae_scale_factor_spatial)
        check_video_frames(params, self.vae_scale_factor_temporal)
        for name in ("true_cfg_scale", "guidance_scale_2"):
            if getattr(params, name) is not None:
                raise RequestError(name, f"{name}: not used by Cosmos3 (its CFG scale is guidance_scale)")
        if request.mask:
            raise RequestError("mask", "mask: Cosmos3 conditions on a video's frames, without a mask")
        if len(request.images) > 1:
            raise RequestError("image", f"image: expected at most one input image, got {len(request.images)}")
        if request.images and request.video:
            raise RequestError("video", "video: give an input image (image-to-video) or a video (video-to-video), "
                               "not both")
        if params.num_frames == 1 and (request.images or request.video):
            name = "image" if request.images else "video"
            raise RequestError(name, f"{name}: num_frames=1 makes an image from text alone; ask for more frames "
                               "to condition on an input")
        if request.video:
            self._check_condition_frames(params)

    def _check_condition_frames(self, params: Any) -> None:
        indexes = params.extras["condition_frame_indexes_vision"]
        name = "condition_frame_indexes_vision"
        if not indexes or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indexes):
            raise RequestError(name, f"extras.{name} must be a non-empty list of latent frame indexes >= 0, "
                               f"got {indexes!r}")
        num_latent_frames = (params.num_frames - 1) // self.vae_scale_factor_temporal + 1
        if max(indexes) >= num_latent_frames:
            raise RequestError(name, f"extras.{name}: index {max(indexes)} is past the last latent frame "
                               f"({num_latent_frames} for num_frames={params.num_frames})")

    # -- 2. encode: token ids, packed sequences, initial latents, timesteps ----------------

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        return [self._initial_state(r) for r in requests]

    def _initial_state(self, request: DiffusionRequest) -> DenoiseState:
        params, extras = request.params, request.params.extras
        guided = params.guidance_scale != 1.0
        cond_ids, uncond_ids = self.recipe.tokenize_prompt(
            request.prompt, params.negative_prompt, num_frames=params.num_frames, height=params.height,
            width=params.width, fps=params.fps, use_system_prompt=extras["use_system_prompt"],
            add_resolution_template=extras["add_resolution_template"],
            add_duration_template=extras["add_duration_template"])
        latents, mask = self._initial_latents(request)
        noise_scheduler = self.noise_scheduler_copy()
        if self.use_native_flow_schedule:  # Cosmos3OmniPipeline.__call__, step 6
            num_train = noise_scheduler.config.num_train_timesteps
            sigmas = np.linspace(1.0 - 1.0 / num_train, 0.0, params.num_inference_steps + 1)[:-1]
            noise_scheduler.set_timesteps(params.num_inference_steps, device=self.device, sigmas=sigmas)
        else:
            noise_scheduler.set_timesteps(params.num_inference_steps, device=self.device)
        cond = {
            "cond": self._pack(cond_ids, latents, mask, params.fps),
            "uncond": self._pack(uncond_ids, latents, mask, params.fps) if guided else None,
            "vision_condition_mask": mask,
            "guidance_scale": params.guidance_scale,
        }
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler,
                            timesteps=noise_scheduler.timesteps, cond=cond)

    def _initial_latents(self, request: DiffusionRequest) -> tuple[torch.Tensor, torch.Tensor]:
        """([1, C, T, H, W] float32 latents, [T, 1, 1] mask: 1 on pinned latent frames)."""
        from diffusers.utils.torch_utils import randn_tensor

        params, extras = request.params, request.params.extras
        generator = self.generator_for(request)
        if not (request.images or request.video):
            # Text only: diffusers VAE-encodes an all-zero clip and keeps none of it (mask 0);
            # the same noise without that encode.
            shape = (1, self.vae.config.z_dim, (params.num_frames - 1) // self.vae_scale_factor_temporal + 1,
                     params.height // self.vae_scale_factor_spatial, params.width // self.vae_scale_factor_spatial)
            latents = randn_tensor(shape, generator=generator, device=self.device, dtype=torch.float32)
            return latents, latents.new_zeros(shape[2], 1, 1)
        prepared = self.recipe.prepare_latents(
            image=request.images[0] if request.images else None, video=request.video or None,
            condition_frame_indexes_vision=extras["condition_frame_indexes_vision"],
            condition_video_keep=extras["condition_video_keep"], num_frames=params.num_frames,
            height=params.height, width=params.width, fps=params.fps, generator=generator, device=self.device,
            dtype=torch.float32)
        return prepared[0], prepared[5]  # the vision latents and their condition mask

    def _pack(self, input_ids: list[int], latents: torch.Tensor, mask: torch.Tensor, fps: float) -> dict[str, Any]:
        """The static part of one branch's packed sequence (Cosmos3OmniPipeline.__call__, steps
        3 and 5): its text segment, then the video tokens; only their values change per step."""
        text = self.recipe._prepare_text_segment(input_ids, device=self.device)
        pinned = [int(i) for i in torch.nonzero(mask[:, 0, 0] > 0).flatten()]
        vision = self.recipe._prepare_vision_segment(
            input_vision_tokens=latents, has_image_condition=bool(pinned),
            mrope_offset=text["vision_start_temporal_offset"], vision_fps=fps, curr=text["und_len"],
            device=self.device, condition_frame_indexes=pinned)
        packed = {**text, **vision,
                  "position_ids": torch.cat([text["text_mrope_ids"], vision["vision_mrope_ids"]], dim=1),
                  "sequence_length": text["und_len"] + vision["num_vision_tokens"]}
        return {"input_ids": packed["input_ids"], "num_noisy_vision_tokens": vision["num_noisy_vision_tokens"],
                "inputs": {name: packed[name] for name in _PACK_INPUTS}}

    # -- 3. denoise -----------------------------------------------------------------------

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        for state, velocity in zip(states, self.guided_predictions(states, self._predict)):
            self._step(state, velocity)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """One transformer call per row: the packed sequence holds one sample."""
        preds = []
        for state, branch in rows:
            pack = state.cond[branch]
            timestep = state.timesteps[state.step_index].item()
            vision = self.transformer(
                pack["input_ids"],
                vision_tokens=[state.latents.to(self.transformer.dtype)],
                vision_timesteps=torch.full((pack["num_noisy_vision_tokens"],), timestep, device=self.device),
                return_dict=False,
                **pack["inputs"],
            )[0][0]
            # Pinned frames move with zero velocity (Cosmos3OmniPipeline._mask_velocity_predictions).
            preds.append((vision * (1.0 - state.cond["vision_condition_mask"]).to(vision.dtype)).float())
        return preds

    @staticmethod
    def _step(state: DenoiseState, velocity: torch.Tensor) -> None:
        # diffusers steps the latents with one more leading axis (UniPC's einsum wants a batch axis).
        t = state.timesteps[state.step_index]
        stepped = state.noise_scheduler.step(velocity.unsqueeze(0), t, state.latents.unsqueeze(0), return_dict=False)
        state.latents = stepped[0].squeeze(0)
        state.step_index += 1

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # States with the same latent shape share one VAE call.
        return map_groups(states, lambda s: tuple(s.latents.shape), self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        latents = torch.cat([s.latents for s in states]).to(self.vae.dtype)
        mean, inv_std = latent_stats(self.vae, latents.shape[1], self.device, self.vae.dtype)
        video = self.vae_decode(latents / inv_std + mean).float()
        return list(self.recipe.video_processor.postprocess_video(video, output_type="np"))  # [F, H, W, 3] each
