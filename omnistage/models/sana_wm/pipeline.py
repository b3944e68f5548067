"""SANA-WM camera-controlled image-to-video: a Gemma 2 text model, a 3D DiT whose blocks read the
camera (a ray map per latent frame and Plücker coordinates per 8-frame chunk), and the LTX-2 VAE.

Reproduces `diffusers.SanaWMPipeline` (pipelines/sana_wm/pipeline_sana_wm.py, its stage-1
sampling) as `SanaWM`, split at the encode / denoise_step / decode seams. A world model: the
input image is the first frame and the camera path says how the view moves from it.

- The camera path is an extra: `action`, diffusers' WASD (move) / IJKL (turn) string of
  `<keys>-<frames>` segments (one pose per frame after the first), or `c2w`, one 4x4
  camera-to-world pose per frame; and `intrinsics`, `[fx, fy, cx, cy]` in the input image's
  pixels (or a 3x3 K, or one per frame), rescaled for the resize and centre crop as diffusers does.
- `num_frames` must be 8k+1 frames (the VAE's temporal stride) and at most the path's poses; diffusers
  snaps it to the nearest such count and trims it to the path; we refuse, so the video has the
  frames asked for.
- The first latent frame is the VAE-encoded image: its tokens get timestep 0 and the Euler
  steps (per-token timesteps) leave it clean.
- Prompt encoding, the camera tensors, the image crop and the first-frame latents are the
  diffusers pipeline's own methods (`recipe`, built over our components).
- Not served: the stage-2 refiner (`SanaWMRefiner`), a custom `chi_prompt`, precomputed embeddings.
"""

from __future__ import annotations

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
    check_one_image,
    check_video_frames,
    map_groups,
    split_per_state,
)
from omnistage.models.ltx2.pipeline import vae_ratios


def _guidance_scale(state: DenoiseState) -> float | None:
    # diffusers guides only above 1.
    return state.cond["guidance_scale"] if state.cond["guidance_scale"] > 1.0 else None


def camera_path(extras: dict[str, Any]) -> np.ndarray:
    """The (F, 4, 4) camera-to-world poses of `extras.action` or `extras.c2w`; a RequestError naming
    the extra that is missing or malformed."""
    from diffusers.pipelines.sana_wm.cam_utils import action_string_to_c2w

    action, c2w = extras.get("action"), extras.get("c2w")
    if (action is None) == (c2w is None):
        raise RequestError("action", "give the camera path as extras.action (e.g. 'w-80,jw-40') or extras.c2w "
                           "(4x4 poses), exactly one of them")
    if action is not None:
        try:
            return action_string_to_c2w(action)
        except ValueError as e:
            raise RequestError("action", f"extras.action: {e}") from None
    try:
        poses = np.asarray(c2w, dtype=np.float32)
    except (TypeError, ValueError):
        poses = None
    if poses is None or poses.ndim != 3 or poses.shape[1:] != (4, 4) or not np.isfinite(poses).all():
        raise RequestError("c2w", "extras.c2w must be a list of 4x4 camera-to-world matrices of finite numbers, "
                           "one per frame")
    return poses


def check_intrinsics(intrinsics: Any, num_frames: int) -> None:
    """[fx, fy, cx, cy], a 3x3 K, or one of either per frame (at least `num_frames`), all finite."""
    try:
        intr = np.asarray(intrinsics, dtype=np.float32)
    except (TypeError, ValueError):
        intr = None
    shapes_ok = intr is not None and (intr.shape in ((4,), (3, 3)) or (intr.ndim == 2 and intr.shape[1] == 4)
                                      or (intr.ndim == 3 and intr.shape[1:] == (3, 3)))
    if not shapes_ok or not np.isfinite(intr).all() or (intr.ndim > 1 and intr.shape != (3, 3)
                                                        and intr.shape[0] < num_frames):
        raise RequestError("intrinsics", "extras.intrinsics must be [fx, fy, cx, cy] (input image pixels), a 3x3 "
                           f"K matrix, or one of either per frame (at least {num_frames}), got {intrinsics!r}")


class SanaWM(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "SanaWMPipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        vae_tiling=True, offload=True, quantization=True, compile=True,
        refused={"cache_backend": "no step-cache block chain is written for its camera-conditioned blocks",
                 "ulysses_degree": "its gated-delta-net attention has no sequence-parallel plan",
                 "cfg_parallel_size": "its camera-conditioned branches are not run on two ranks yet",
                 "lora": "diffusers' SanaWMPipeline has no LoRA loader"})
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->vae"
    output_modality: ClassVar[str] = "video"
    needs_image: ClassVar[bool] = True
    # SanaWMPipeline.__call__ defaults (704 x 1280: the public model's only size).
    default_params: ClassVar[dict[str, Any]] = {
        "height": 704,
        "width": 1280,
        "num_frames": 161,
        "fps": 16,
        "num_inference_steps": 60,
        "guidance_scale": 5.0,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "action": ExtraSpec(str, help="Camera path: '<keys>-<frames>' segments, keys W/A/S/D move, I/J/K/L turn "
                                      "(e.g. 'w-80,jw-40,w-40'); or give c2w."),
        "c2w": ExtraSpec(list, help="Camera path: one 4x4 camera-to-world pose per frame (OpenCV axes); or give "
                                    "action."),
        "intrinsics": ExtraSpec(list, help="Camera intrinsics [fx, fy, cx, cy] in the input image's pixels (or a "
                                           "3x3 K, or one per frame). Required."),
        "max_sequence_length": ExtraSpec(int, max_from=("tokenizer", "text_encoder"), default=300, min=1,
                                         help="Gemma prompt tokens the transformer attends to (padded to this)."),
    }
    # diffusers batches [uncond, cond] into one transformer call.
    guidance: ClassVar[Guidance] = Guidance(scale=_guidance_scale, combine=plain_cfg, batch_branches=True)

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers import SanaWMPipeline
        from diffusers.pipelines.sana_wm.pipeline_sana_wm import DEFAULT_CHI_PROMPT

        super().__init__(components, device, dtype, configs)
        # diffusers' pipeline over the very same modules: its prompt, camera and first-frame
        # methods are the recipe every request is prepared with.
        self.recipe = SanaWMPipeline(tokenizer=self.tokenizer, text_encoder=self.text_encoder, vae=self.vae,
                                     transformer=self.transformer, scheduler=self.noise_scheduler)
        # The instruction diffusers puts before every prompt when its call gives none.
        self.chi_prompt = list(DEFAULT_CHI_PROMPT)

    def configure(self, configs: CheckpointConfigs) -> None:
        self.vae_spatial_ratio, self.vae_temporal_ratio = vae_ratios(configs.vae)

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        check_one_image(request)
        params = request.params
        check_divisible(params, height=self.vae_spatial_ratio, width=self.vae_spatial_ratio)
        check_video_frames(params, self.vae_temporal_ratio)
        for name in ("true_cfg_scale", "guidance_scale_2"):
            if getattr(params, name) is not None:
                raise RequestError(name, f"{name}: not used by SANA-WM (its CFG scale is guidance_scale)")
        poses = camera_path(params.extras)
        if params.num_frames > len(poses):
            raise RequestError("num_frames", f"num_frames={params.num_frames} is more than the camera path's "
                               f"{len(poses)} poses")
        if "intrinsics" not in params.extras:
            raise RequestError("intrinsics", "extras.intrinsics is required: [fx, fy, cx, cy] in the input "
                               "image's pixels")
        check_intrinsics(params.extras["intrinsics"], params.num_frames)

    # -- 2. encode: prompts, camera, first frame, initial noise, timesteps -----------------

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        return [self._initial_state(r) for r in requests]

    def _initial_state(self, request: DiffusionRequest) -> DenoiseState:
        params, extras = request.params, request.params.extras
        dtype = self.transformer.dtype
        size = (params.height, params.width)
        # SanaWMPipeline.__call__: trajectory, image crop with its intrinsics, prompts, first frame, camera.
        c2w, intrinsics = self.recipe.prepare_camera_trajectory(
            extras.get("c2w"), extras.get("action"), extras["intrinsics"], params.num_frames)
        pixels, intrinsics = self.recipe.image_processor.preprocess_with_intrinsics(
            request.images[0], intrinsics, *size)
        prompt, prompt_mask, negative, negative_mask = self.recipe.encode_prompt(
            request.prompt, params.negative_prompt or "", device=self.device,
            max_sequence_length=extras["max_sequence_length"], chi_prompt=self.chi_prompt)
        first_latent = self.recipe._encode_first_frame(pixels, self.device, dtype)
        camera = self.recipe._build_camera_kwargs(c2w, intrinsics, size, device=self.device, dtype=dtype,
                                                  do_cfg=False)
        latents, condition_mask = self.recipe.prepare_latents(first_latent, params.num_frames, *size, dtype,
                                                              self.device, self.generator_for(request))
        noise_scheduler = self.noise_scheduler_copy()
        noise_scheduler.set_timesteps(params.num_inference_steps, device=self.device)
        cond = {"prompt_embeds": prompt, "prompt_mask": prompt_mask, "negative_prompt_embeds": negative,
                "negative_prompt_mask": negative_mask, "condition_mask": condition_mask,
                "guidance_scale": params.guidance_scale, **camera}
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler,
                            timesteps=noise_scheduler.timesteps, cond=cond)

    # -- 3. denoise -----------------------------------------------------------------------

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # One transformer call needs equal latent shapes and prompt lengths.
        def key(s: DenoiseState) -> tuple:
            return tuple(s.latents.shape[1:]), s.cond["prompt_embeds"].shape[2]

        self.guided_steps(states, key, self._predict, self._step)

    @staticmethod
    def _timesteps(state: DenoiseState) -> torch.Tensor:
        """[1, C, T, H, W]: the step's timestep on every token, 0 on the first (clean) frame's."""
        mask = state.cond["condition_mask"]
        t = state.timesteps[state.step_index].expand(mask.shape).float()
        return torch.min(t, (1.0 - mask) * 1000.0)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        states = [s for s, _ in rows]
        prefix = ["" if branch == "cond" else "negative_" for _, branch in rows]
        height, width = states[0].request.params.height, states[0].request.params.width
        noise_pred = self.transformer(
            torch.cat([s.latents for s in states]),
            torch.cat([self._timesteps(s)[:, :1, :, 0, 0] for s in states]),  # [B, 1, T]
            torch.cat([s.cond[p + "prompt_embeds"] for s, p in zip(states, prefix)]),
            return_dict=False,
            data_info={"img_hw": torch.tensor([[height, width]], dtype=torch.float, device=self.device)},
            mask=torch.cat([s.cond[p + "prompt_mask"] for s, p in zip(states, prefix)]),
            camera_conditions=torch.cat([s.cond["camera_conditions"] for s in states]),
            chunk_plucker=torch.cat([s.cond["chunk_plucker"] for s in states]),
        )[0]
        return split_per_state(noise_pred, states)

    def _step(self, state: DenoiseState, noise_pred: torch.Tensor) -> None:
        """SanaWMPipeline's Euler step over tokens with their own timesteps; the clean frame stays."""
        t = state.timesteps[state.step_index]
        latents, mask = state.latents, state.cond["condition_mask"]
        b, c, f, h, w = latents.shape
        denoised = state.noise_scheduler.step(
            -noise_pred.reshape(b, c, -1).transpose(1, 2), t, latents.reshape(b, c, -1).transpose(1, 2),
            per_token_timesteps=self._timesteps(state).reshape(b, c, -1)[:, 0], return_dict=False)[0]
        denoised = denoised.transpose(1, 2).reshape(b, c, f, h, w)
        keep_clean = t / 1000.0 - 1e-6 < (1.0 - mask)
        state.latents = torch.where(keep_clean, denoised, latents).to(latents.dtype)
        state.step_index += 1

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # States with the same latent shape share one VAE call.
        return map_groups(states, lambda s: tuple(s.latents.shape), self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        latents = torch.cat([s.latents for s in states]).to(self.device, dtype=self.vae.dtype)
        mean = self.vae.latents_mean.view(1, -1, 1, 1, 1).to(latents)
        std = self.vae.latents_std.view(1, -1, 1, 1, 1).to(latents)
        video = self.vae_decode(latents / self.vae.config.scaling_factor * std + mean)
        return list(self.recipe.video_processor.postprocess_video(video, output_type="np"))  # [F, H, W, 3] each

