"""Serve any diffusers pipeline through its own `__call__`, one request at a time.

The fallback for families without a native pipeline (see `pipeline_class`). It maps
`DiffusionParams` onto the call's keyword arguments, reads its defaults and extras off
the `__call__` signature, and runs request mode only: diffusers owns the denoising loop,
so there is no seam for the step scheduler to add or drop requests between steps.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import DenoiseState, DiffusionPipelineBase, DiffusionRequest, ProgressCallback

# DiffusionParams field -> the `__call__` argument that carries it (where the names differ,
# the first one the pipeline accepts wins).
_FIELD_ARGS: dict[str, tuple[str, ...]] = {
    "negative_prompt": ("negative_prompt",),
    "height": ("height",),
    "width": ("width",),
    "num_frames": ("num_frames",),
    "num_inference_steps": ("num_inference_steps",),
    "guidance_scale": ("guidance_scale",),
    "true_cfg_scale": ("true_cfg_scale",),
    "guidance_scale_2": ("guidance_scale_2",),
    "num_outputs_per_prompt": ("num_images_per_prompt", "num_videos_per_prompt"),
}
# Arguments we set ourselves or that only steer the output plumbing: never extras.
_RESERVED_ARGS = {"prompt", "image", "generator", "output_type", "return_dict", "callback_on_step_end",
                  "callback_on_step_end_tensor_inputs", "callback", "callback_steps"}
_EXTRA_TYPES = (bool, int, float, str)

_STEP_MODE_ERROR = ("{name} runs diffusers' own __call__ and supports request mode only; step mode "
                    "(encode / denoise_step / decode) needs a native pipeline (register_diffusion_pipeline)")


class GenericDiffusersPipeline(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "DiffusionPipeline"  # any; the instance holds the real class name
    supports_step_execution: ClassVar[bool] = False
    max_batch_size: ClassVar[int | None] = 1

    def __init__(self, pipe: Any, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        super().__init__(pipe.components, device, dtype)
        self.pipe = pipe
        self.reference_class = type(pipe).__name__
        self.call_params = inspect.signature(pipe.__call__).parameters
        # field -> the argument name this pipeline uses for it
        self.field_args = {f: next((a for a in args if a in self.call_params), None) for f, args in _FIELD_ARGS.items()}
        self.output_modality = "video" if "num_frames" in self.call_params else "image"
        # A pipeline that takes `image` (img2img, edit, I2V) is served as one that needs it.
        self.needs_image = "image" in self.call_params
        self.default_params = self._signature_defaults()
        self.extras = self._signature_extras()

    @classmethod
    def from_pretrained(cls, path: str, device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32) -> "GenericDiffusersPipeline":
        from diffusers import DiffusionPipeline

        pipe = DiffusionPipeline.from_pretrained(str(path), dtype=dtype).to(device)
        pipe.set_progress_bar_config(disable=True)  # progress goes through `on_step`
        return cls(pipe, device, dtype)

    def _signature_defaults(self) -> dict[str, Any]:
        """diffusers' own defaults for the fields this pipeline takes (None ones stay None:
        the pipeline derives them, e.g. height from the checkpoint)."""
        defaults = {}
        for field, arg in self.field_args.items():
            default = self.call_params[arg].default if arg else None
            if field != "num_outputs_per_prompt" and default not in (None, inspect.Parameter.empty):
                defaults[field] = default
        return defaults

    def _signature_extras(self) -> dict[str, ExtraSpec]:
        """Every other scalar keyword of `__call__` (e.g. max_sequence_length, strength) as an extra.
        No default is declared, so only what a request sets is passed and diffusers fills the rest."""
        taken = _RESERVED_ARGS | {a for a in self.field_args.values() if a}
        extras = {}
        for name, param in self.call_params.items():
            default = param.default
            if name in taken or not isinstance(default, _EXTRA_TYPES):
                continue
            kind = float if param.annotation in (float, "float") else type(default)
            extras[name] = ExtraSpec(kind, help=f"{self.reference_class} argument (diffusers default {default!r})")
        return extras

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params
        for field, arg in self.field_args.items():
            if arg is None and field != "num_outputs_per_prompt" and getattr(params, field) is not None:
                raise ValueError(f"{field}: {self.reference_class} does not take this parameter")
        if params.num_outputs_per_prompt > 1 and (self.field_args["num_outputs_per_prompt"] is None
                                                  or self.output_modality == "video"):
            raise ValueError(f"num_outputs_per_prompt: {self.reference_class} returns one output per request")

    def call_kwargs(self, request: DiffusionRequest) -> dict[str, Any]:
        """The `__call__` keyword arguments for a prepared request: its fields, image, extras
        and a generator seeded with its seed; float arrays out."""
        params = request.params
        kwargs: dict[str, Any] = {"prompt": request.prompt}
        for field, arg in self.field_args.items():
            value = getattr(params, field)
            if arg is not None and value is not None:
                kwargs[arg] = value
        if request.images:
            kwargs["image"] = request.images[0] if len(request.images) == 1 else list(request.images)
        kwargs.update(params.extras)
        kwargs["generator"] = self.generator_for(request)
        kwargs["output_type"] = "np"
        return kwargs

    # -- request mode ---------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, requests: list[DiffusionRequest], on_step: ProgressCallback | None = None) -> list[Any]:
        if len(requests) != 1:
            raise ValueError(f"{self.reference_class} through the generic adapter runs one request per "
                             f"forward call, got {len(requests)}")
        request = self.prepare_request(requests[0])
        return [self.to_payload(self.generate_array(request, on_step), request)]

    def generate_array(self, request: DiffusionRequest, on_step: ProgressCallback | None = None) -> np.ndarray:
        """Run diffusers on one prepared request: float array in [0, 1], images [n, H, W, 3] or
        video [num_frames, H, W, 3]."""
        kwargs = self.call_kwargs(request)
        if on_step is not None and "callback_on_step_end" in self.call_params:
            kwargs["callback_on_step_end"] = self._progress_callback(request, on_step)
        output = self.pipe(**kwargs)
        if self.output_modality == "video":
            return np.asarray(output.frames[0])
        return np.asarray(output.images)

    def _progress_callback(self, request: DiffusionRequest, on_step: ProgressCallback):
        # Reports a DenoiseState view of diffusers' loop after each step (latents, position).
        def callback(pipe, i, t, callback_kwargs):
            scheduler = pipe.scheduler
            state = DenoiseState(request=request, latents=callback_kwargs.get("latents"), scheduler=scheduler,
                                 timesteps=scheduler.timesteps, step_index=i + 1)
            on_step([state])
            return {}

        return callback

    # -- step mode: not available -----------------------------------------------------------

    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        raise NotImplementedError(_STEP_MODE_ERROR.format(name=self.reference_class))

    def denoise_step(self, states: list[DenoiseState]) -> None:
        raise NotImplementedError(_STEP_MODE_ERROR.format(name=self.reference_class))

    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        raise NotImplementedError(_STEP_MODE_ERROR.format(name=self.reference_class))
