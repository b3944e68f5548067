"""The SDXL refiner as the second expert of diffusers' ensemble: it continues the base's latents
from `denoising_start` to the end of the schedule.

Reproduces `diffusers.StableDiffusionXLImg2ImgPipeline`
(pipelines/stable_diffusion_xl/pipeline_stable_diffusion_xl_img2img.py) called on the base's
`output_type="latent"` output with `denoising_start`, on `StableDiffusionXL`'s seams: the
refiner checkpoint has only the CLIP-G encoder (its embeddings alone), its UNet is
micro-conditioned on an aesthetic score instead of the target size
(`requires_aesthetics_score`), its schedule is the same `num_inference_steps` one from the
cut on, and it starts from the handed-on latents with no noise added (diffusers' `add_noise=False`).

The latents come from the base stage (`request.condition["latents"]`, see `__init__.py`'s
`sdxl_refiner` pipeline); refining an input image (img2img with `strength`) is not served.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import DiffusionRequest
from omnistage.models.sdxl.pipeline import StableDiffusionXL, timestep_cutoff


class StableDiffusionXLRefiner(StableDiffusionXL):
    reference_class: ClassVar[str] = "StableDiffusionXLImg2ImgPipeline"
    # StableDiffusionXLImg2ImgPipeline.__call__ defaults; the size is the handed-on latents'.
    default_params: ClassVar[dict[str, Any]] = {"num_inference_steps": 50, "guidance_scale": 5.0}
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "guidance_rescale": StableDiffusionXL.extras["guidance_rescale"],
        "denoising_start": ExtraSpec(float, min=0.0, max=1.0, help="Start at this fraction of the schedule, where "
                                                                    "the base stopped (its denoising_end)."),
        "aesthetic_score": ExtraSpec(float, default=6.0, help="The score the cond branch is conditioned on."),
        "negative_aesthetic_score": ExtraSpec(float, default=2.5,
                                              help="The score the uncond branch is conditioned on."),
    }

    def configure(self, configs: CheckpointConfigs) -> None:
        super().configure(configs)
        self.default_params = dict(type(self).default_params)  # no size: the latents give it
        self.requires_aesthetics_score = configs.pipeline.get("requires_aesthetics_score", False)

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        latents = request.condition.get("latents")
        if latents is None:
            raise RequestError("condition", "condition: the SDXL refiner continues a base stage's latents; serve it "
                                            "as the second stage of an SDXL base (deploy file sdxl_refiner.yaml)")
        if request.params.extras.get("denoising_start") is None:
            raise RequestError("denoising_start", "denoising_start: the refiner needs the fraction of the schedule "
                                                  "the base stopped at")
        if latents.shape[0] != request.params.num_outputs_per_prompt:
            raise RequestError("num_outputs_per_prompt", f"num_outputs_per_prompt: {latents.shape[0]} latents were "
                               f"handed on, {request.params.num_outputs_per_prompt} outputs asked for")
        super().check_inputs(request)

    def prepare_request(self, request: DiffusionRequest) -> DiffusionRequest:
        # The size is the handed-on latents' (diffusers reads it from them too).
        latents = request.condition.get("latents")
        if latents is not None:
            factor = self.vae_scale_factor
            request = _with_params(request, height=latents.shape[-2] * factor, width=latents.shape[-1] * factor)
        return super().prepare_request(request)

    # -- 2. encode: the base's latents, the schedule from denoising_start --------------------

    def _timesteps(self, noise_scheduler: Any, params: Any) -> torch.Tensor:
        from diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl import retrieve_timesteps

        timesteps, _ = retrieve_timesteps(noise_scheduler, params.num_inference_steps, self.device)
        num_steps = int((timesteps < timestep_cutoff(noise_scheduler, params.extras["denoising_start"])).sum())
        if noise_scheduler.order == 2 and num_steps % 2 == 0:
            num_steps += 1  # a second-order scheduler must not stop between its two evaluations
        start = len(timesteps) - num_steps
        noise_scheduler.set_begin_index(start)
        return timesteps[start:]

    def _start_latents(self, request: DiffusionRequest, noise_scheduler: Any, generator: torch.Generator,
                       dtype: torch.dtype) -> torch.Tensor:
        return request.condition["latents"].to(self.device, dtype)

    def _time_ids(self, params: Any) -> tuple[list[float], list[float]]:
        size = [params.height, params.width, 0, 0]  # original size, crop top-left
        if self.requires_aesthetics_score:
            return size + [params.extras["aesthetic_score"]], size + [params.extras["negative_aesthetic_score"]]
        return super()._time_ids(params)


def _with_params(request: DiffusionRequest, **fields: Any) -> DiffusionRequest:
    import dataclasses

    return dataclasses.replace(request, params=request.params.model_copy(update=fields))

