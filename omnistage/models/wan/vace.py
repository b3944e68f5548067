"""Wan-VACE: Wan text-to-video steered by a control video, its mask and reference images.

Reproduces `diffusers.WanVACEPipeline` (pipelines/wan/pipeline_wan_vace.py) as `WanVACE`, a
Wan pipeline (prompts, noise, experts, guidance and decoding are Wan's) whose transformer also
takes control latents through its VACE blocks:

- the control video (zeros without one) is VAE-encoded twice, the frames the mask keeps
  ("inactive") and those it regenerates ("reactive"), and the mask is folded 8 x 8 into
  channels at the latent frame rate (mask white: generate; black: keep);
- each reference image, fitted onto a white canvas of the video's size, is encoded into one
  latent frame put before the video's; the noise gets those frames too, and they are dropped
  before decoding.

The request carries the control video and mask as PIL frames (`DiffusionRequest.video` /
`.mask`) and the reference images as its input images. Sizes are refused, not rescaled: the
control video and mask have the requested size and `num_frames` frames.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.accel.declaration import Accelerations
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import DenoiseState, DiffusionRequest
from omnistage.models.wan.pipeline import _Wan


class WanVACE(_Wan):
    reference_class: ClassVar[str] = "WanVACEPipeline"
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->transformer_2->vae"
    _optional_components: ClassVar[list[str]] = ["transformer", "transformer_2"]
    takes_image: ClassVar[bool] = True  # reference images, any number (none is plain T2V)
    takes_video: ClassVar[bool] = True
    # The VACE blocks' hints are added between the DiT blocks in the transformer's own loop, which
    # Wan's block chain does not see: step caches are refused rather than skip them unchecked.
    step_cache_blocks: ClassVar[Any] = None
    supported_accelerations: ClassVar[Accelerations] = dataclasses.replace(
        _Wan.supported_accelerations, step_caches=(), sequence_parallel=None,
        refused={"cache_backend": "its VACE hints are added between Wan's blocks, which the caches would skip",
                 "ulysses_degree": "diffusers' WanVACETransformer3DModel has no context-parallel plan",
                 "ring_degree": "diffusers' WanVACETransformer3DModel has no context-parallel plan"})
    extras: ClassVar[dict[str, ExtraSpec]] = {
        **_Wan.extras,
        # diffusers also takes one scale per VACE layer; one for all of them is served.
        "conditioning_scale": ExtraSpec(float, default=1.0,
                                        help="How strongly the control latents steer every VACE block."),
    }

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        import PIL.Image

        super().check_inputs(request)
        params = request.params
        if request.mask and not request.video:
            raise RequestError("mask", "mask: give a control video with it (the mask says which of its pixels to keep)")
        for name in ("video", "mask"):
            frames = getattr(request, name)
            if frames and len(frames) != params.num_frames:
                raise RequestError(name, f"{name}: expected num_frames={params.num_frames} frames, got {len(frames)}")
            for i, frame in enumerate(frames):
                if not isinstance(frame, PIL.Image.Image):
                    raise RequestError(name, f"{name}[{i}]: must be a PIL image, got {type(frame).__name__}")
                if frame.size != (params.width, params.height):
                    raise RequestError(name, f"{name}: frames must be {params.width}x{params.height} (the video's "
                                       f"size), got {frame.size[0]}x{frame.size[1]}")
        for i, image in enumerate(request.images):
            if not isinstance(image, PIL.Image.Image):
                raise RequestError("image", f"image[{i}]: must be a PIL image, got {type(image).__name__}")

    # -- 2. encode: the control latents ---------------------------------------------------

    def _num_latent_frames(self, request: DiffusionRequest) -> int:
        # One more latent frame per reference image, as diffusers adds scale_factor_temporal frames each.
        return super()._num_latent_frames(request) + len(request.images)

    def _condition(self, request: DiffusionRequest, latents: torch.Tensor) -> dict[str, Any]:
        """WanVACEPipeline's preprocess_conditions, prepare_video_latents and prepare_masks for one
        request. diffusers' own methods run with this pipeline as `self`: they read only
        `video_processor`, `vae`, `transformer` / `transformer_2` and the VAE scale factors, which
        this class holds under the same names."""
        from diffusers import WanVACEPipeline

        params = request.params
        video, mask, references = WanVACEPipeline.preprocess_conditions(
            self, request.video or None, request.mask or None, list(request.images) or None, 1, params.height,
            params.width, params.num_frames, torch.float32, self.device)
        control = WanVACEPipeline.prepare_video_latents(self, video, mask, references, None, self.device)
        mask = WanVACEPipeline.prepare_masks(self, mask, references, None)
        control = torch.cat([control, mask], dim=1).to(self.main_transformer.dtype)
        num_layers = len(self.main_transformer.config.vace_layers)
        scale = torch.full((num_layers,), params.extras["conditioning_scale"], device=self.device,
                           dtype=self.main_transformer.dtype)
        return {**super()._condition(request, latents), "control": control, "control_scale": scale,
                "num_reference_images": len(request.images)}

    # -- 3. denoise -----------------------------------------------------------------------

    def _call_key(self, state: DenoiseState) -> Any:
        # The transformer takes one conditioning scale per call.
        return state.request.params.extras["conditioning_scale"]

    def _control_kwargs(self, model: Any, states: list[DenoiseState]) -> dict[str, Any]:
        return {"control_hidden_states": torch.cat([s.cond["control"] for s in states]),
                "control_hidden_states_scale": states[0].cond["control_scale"]}

    # -- 4. decode ------------------------------------------------------------------------

    def _final_latents(self, state: DenoiseState) -> torch.Tensor:
        # The reference images' latent frames lead the video; they are not decoded.
        return state.latents[:, :, state.cond["num_reference_images"]:]
