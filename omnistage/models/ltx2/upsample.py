"""LTX-2's latent upsampler: a first stage's video latents -> latents at twice the size (its
`rational_spatial_scale`), which the second stage refines (the two-stage pipeline,
`ltx2_two_stage` in `__init__.py`).

Reproduces `diffusers.LTX2LatentUpsamplePipeline` (pipelines/ltx2/pipeline_ltx2_latent_upsample.py)
called with `latents=` (the first stage's `output_type="latent"` output, not normalised) on the
seams: encode takes the handed-on latents, the one "denoising step" is the upsampler's forward
(then AdaIN towards the input's statistics and tone mapping, when asked), batched over requests
of one latent size, and decode either hands the latents on (`condition["output"] == "latents"`,
what the two-stage pipeline asks for) or decodes them with the VAE, as `output_type="np"` does.
Upsampling a pixel video (diffusers' `video=`) is not served.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.core.errors import RequestError
from omnistage.core.types import LatentPayload
from omnistage.diffusion.accel.declaration import Accelerations
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import DenoiseState, DiffusionPipelineBase, DiffusionRequest, group_by, map_groups


class LTX2LatentUpsample(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "LTX2LatentUpsamplePipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        refused={"cache_backend": "it has no denoising transformer: one upsampler pass",
                 "cfg_parallel_size": "it runs no guidance"})
    output_modality: ClassVar[str] = "video"
    model_cpu_offload_seq: ClassVar[str] = "vae->latent_upsampler"
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "adain_factor": ExtraSpec(float, default=0.0, min=-10.0, max=10.0,
                                  help="Blend of the upsampled latents towards the input's per-channel mean and "
                                       "std (AdaIN); 0 = off (diffusers applies it only above 0)."),
        "tone_map_compression_ratio": ExtraSpec(float, default=0.0, min=0.0, max=1.0,
                                                help="Sigmoid compression of the latents' dynamic range; 0 = off."),
        "decode_timestep": ExtraSpec(float, default=0.0, min=0, max=1,
                                     help="Timestep of a timestep-conditioned VAE decode (video output only)."),
        "decode_noise_scale": ExtraSpec(float, min=0, max=1, help="Noise mixed in before such a decode "
                                                                  "(default: decode_timestep)."),
    }

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.video_processor import VideoProcessor

        super().__init__(components, device, dtype, configs)
        self.video_processor = VideoProcessor(vae_scale_factor=self.vae_spatial_ratio)

    def configure(self, configs: CheckpointConfigs) -> None:
        vae = configs.vae
        scaling = sum(vae.get("spatio_temporal_scaling", ()))
        self.vae_spatial_ratio = vae.get("spatial_compression_ratio") or vae.get("patch_size", 1) * 2 ** scaling
        self.latent_channels = configs.component("latent_upsampler").get("in_channels")

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        latents = request.condition.get("latents")
        if latents is None:
            raise RequestError("condition", "condition: the LTX-2 latent upsampler takes a first stage's video "
                                            "latents ({'latents': [1, C, F, H, W]}); serve it as the middle stage of "
                                            "ltx2_two_stage (deploy file ltx2_two_stage.yaml)")
        if not isinstance(latents, torch.Tensor) or latents.ndim != 5 or latents.shape[0] != 1 \
                or latents.shape[1] != self.latent_channels:
            shape = tuple(latents.shape) if isinstance(latents, torch.Tensor) else type(latents).__name__
            raise RequestError("condition", f"condition.latents: expected a [1, {self.latent_channels}, F, H, W] "
                                            f"tensor, got {shape}")

    def batch_key(self, params: Any) -> tuple:
        return tuple(sorted(params.extras.items()))

    # -- 2. encode: the handed-on latents -------------------------------------------------

    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # One "step": the upsampler's forward. The latents stay un-normalised, as the upsampler was trained.
        return [DenoiseState(request=r, latents=r.condition["latents"].to(self.device, torch.float32),
                             noise_scheduler=None, timesteps=torch.zeros(1),
                             cond={"generator": self.generator_for(r)}) for r in requests]

    # -- 3. the upsampler pass ------------------------------------------------------------

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        for group in group_by(states, lambda s: tuple(s.latents.shape)):
            latents = torch.cat([s.latents for s in group])
            upsampled = self.latent_upsampler(latents.to(self.latent_upsampler.dtype)).float()
            for i, s in enumerate(group):
                s.latents = self._filter(upsampled[i: i + 1], latents[i: i + 1], s.request.params.extras)
                s.num_forwards += 1
                s.step_index += 1

    @staticmethod
    def _filter(latents: torch.Tensor, reference: torch.Tensor, extras: dict[str, Any]) -> torch.Tensor:
        from diffusers import LTX2LatentUpsamplePipeline

        # Both are per sample in diffusers; `self` is not read by either.
        if extras["adain_factor"] > 0.0:
            latents = LTX2LatentUpsamplePipeline.adain_filter_latent(None, latents, reference, extras["adain_factor"])
        if extras["tone_map_compression_ratio"] > 0.0:
            latents = LTX2LatentUpsamplePipeline.tone_map_latents(None, latents, extras["tone_map_compression_ratio"])
        return latents

    # -- 4. decode: hand on, or the VAE -------------------------------------------------

    def decode(self, states: list[DenoiseState]) -> list[Any]:
        # As the middle stage of the two-stage pipeline, the latents (and what rides with them) go on.
        handed_on = {id(s): LatentPayload(latents=s.latents, extras={k: v for k, v in s.request.condition.items()
                                                                     if k not in ("latents", "output")})
                     for s in states if s.request.condition.get("output") == "latents"}
        rest = [s for s in states if id(s) not in handed_on]
        decoded = dict(zip(map(id, rest), super().decode(rest))) if rest else {}
        return [handed_on.get(id(s)) or decoded[id(s)] for s in states]

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        return map_groups(states, lambda s: tuple(s.latents.shape), self._decode_videos)

    def _decode_videos(self, states: list[DenoiseState]) -> list[np.ndarray]:
        from diffusers.utils.torch_utils import randn_tensor

        latents = torch.cat([s.latents for s in states])
        timestep = None
        if self.vae.config.timestep_conditioning:
            # LTX2LatentUpsamplePipeline mixes the noise into the un-normalised latents.
            noise = torch.cat([randn_tensor((1, *latents.shape[1:]), generator=s.cond["generator"],
                                            device=self.device, dtype=latents.dtype) for s in states])
            decode_t = [s.request.params.extras["decode_timestep"] for s in states]
            scales = [s.request.params.extras.get("decode_noise_scale") for s in states]
            scales = [t if n is None else n for t, n in zip(decode_t, scales)]
            timestep = torch.tensor(decode_t, device=self.device, dtype=latents.dtype)
            scale = torch.tensor(scales, device=self.device, dtype=latents.dtype)[:, None, None, None, None]
            latents = (1 - scale) * latents + scale * noise
        video = self.vae.decode(latents.to(self.vae.dtype), timestep, return_dict=False)[0]
        return list(self.video_processor.postprocess_video(video, output_type="np"))
