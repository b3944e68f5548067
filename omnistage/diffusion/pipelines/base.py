"""The seam between the diffusion runtime and one model family.

A native pipeline is built from diffusers components (transformer, VAE, text encoders,
scheduler) and splits generation the way diffusers' modular pipelines do:

    encode(requests)      -> one DenoiseState per request (text/image conditioning,
                             initial latents, its own scheduler with timesteps set)
    denoise_step(states)  -> advance every state by one step, in batched transformer calls
    decode(states)        -> one ImagePayload / VideoPayload per request

so the step scheduler can add and drop requests between steps. `forward(requests)` runs
the whole loop for request mode. Batching never changes a request's result: every
request draws its noise from its own generator seeded with its own seed.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.params import DiffusionParams, ExtraSpec, validate_extras
from omnistage.engine.types import ImagePayload, VideoPayload


@dataclass
class DiffusionRequest:
    """One request as a pipeline sees it: the prompt, its input media and its params."""

    request_id: str
    prompt: str
    params: DiffusionParams
    images: list[Any] = field(default_factory=list)  # input PIL images (edit, I2V)


@dataclass
class DenoiseState:
    """Per-request state carried between denoising steps. Pipelines own `cond`'s keys."""

    request: DiffusionRequest
    latents: torch.Tensor  # [num_outputs_per_prompt, ...]
    scheduler: Any  # this request's own scheduler copy, timesteps already set
    timesteps: torch.Tensor
    cond: dict[str, Any] = field(default_factory=dict)  # prompt embeds, masks, image latents, ...
    step_index: int = 0

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)

    @property
    def is_done(self) -> bool:
        return self.step_index >= self.num_steps


ProgressCallback = Callable[[list[DenoiseState]], None]


class DiffusionPipelineBase(ABC):
    """Base for native pipelines. Subclasses declare the class attributes below."""

    reference_class: ClassVar[str]
    """The diffusers pipeline class this one reproduces (model_index.json `_class_name`)."""
    output_modality: ClassVar[str] = "image"  # "image" | "video"
    default_params: ClassVar[dict[str, Any]] = {}
    """Defaults for DiffusionParams fields left as None (diffusers' own call defaults)."""
    extras: ClassVar[dict[str, ExtraSpec]] = {}
    """Model-declared request extras (e.g. max_sequence_length)."""
    needs_image: ClassVar[bool] = False
    """Whether a request must carry an input image (edit, I2V)."""

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32):
        self.components = components
        self.device = torch.device(device)
        self.dtype = dtype
        for name, module in components.items():
            setattr(self, name, module)

    # -- loading -------------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def from_pretrained(cls, path: str, device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32) -> "DiffusionPipelineBase":
        """Load the components from a diffusers folder (or hub id) with diffusers' own classes."""

    # -- request checks ------------------------------------------------------------------

    def prepare_params(self, params: DiffusionParams) -> DiffusionParams:
        """Fill defaults and validate extras; raises ValueError naming the field."""
        params = params.with_defaults(self.default_params)
        return params.model_copy(update={"extras": validate_extras(params.extras, self.extras)})

    def check_inputs(self, request: DiffusionRequest) -> None:
        """Raise ValueError naming the offending field. Override to add family rules."""
        if self.needs_image and not request.images:
            raise ValueError("image: this model needs an input image")
        if not self.needs_image and request.images:
            raise ValueError("image: this model does not take an input image")

    def batch_key(self, params: DiffusionParams) -> tuple:
        """Requests whose keys match may share one request-mode batch."""
        return (params.height, params.width, params.num_frames, params.num_inference_steps,
                params.guidance_scale, params.true_cfg_scale, params.guidance_scale_2,
                tuple(sorted(params.extras.items())))

    # -- the three seams -----------------------------------------------------------------

    @abstractmethod
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]: ...

    @abstractmethod
    def denoise_step(self, states: list[DenoiseState]) -> None:
        """Advance each (unfinished) state by exactly one step. States may differ in step
        count and position; group them by shape where one transformer call cannot mix them."""

    @abstractmethod
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        """Decode finished states to float arrays in [0, 1], one per state: images
        [num_outputs, H, W, 3], video [num_frames, H, W, 3]. Parity tests compare these
        with diffusers' `output_type="np"`."""

    def decode(self, states: list[DenoiseState]) -> list[Any]:
        """Decode finished states into one ImagePayload / VideoPayload per state."""
        from PIL import Image

        payloads = []
        for state, arr in zip(states, self.decode_arrays(states)):
            uint8 = (np.clip(arr, 0.0, 1.0) * 255).round().astype(np.uint8)
            if self.output_modality == "video":
                fps = state.request.params.fps or self.default_params.get("fps", 16)
                payloads.append(VideoPayload(frames=uint8, fps=float(fps)))
            else:
                payloads.append(ImagePayload(images=[Image.fromarray(img) for img in uint8]))
        return payloads

    # -- request mode --------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, requests: list[DiffusionRequest], on_step: ProgressCallback | None = None) -> list[Any]:
        states = self.encode(requests)
        while True:
            running = [s for s in states if not s.is_done]
            if not running:
                break
            self.denoise_step(running)
            if on_step is not None:
                on_step(running)
        return self.decode(states)

    # -- helpers shared by the families --------------------------------------------------

    def generator_for(self, request: DiffusionRequest) -> torch.Generator:
        """The request's own noise source, on CPU like diffusers' tests (device-independent)."""
        seed = request.params.seed if request.params.seed is not None else torch.seed() % 2**63
        return torch.Generator("cpu").manual_seed(seed)

    def scheduler_copy(self) -> Any:
        """A private scheduler per request: diffusers schedulers keep the step index inside."""
        return copy.deepcopy(self.components["scheduler"])


def group_by(states: Iterable[DenoiseState], key: Callable[[DenoiseState], Any]) -> list[list[DenoiseState]]:
    """Split states into lists with equal `key`, keeping their order."""
    groups: dict[Any, list[DenoiseState]] = {}
    for s in states:
        groups.setdefault(key(s), []).append(s)
    return list(groups.values())
