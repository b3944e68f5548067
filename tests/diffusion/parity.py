"""Helpers for parity tests: our pipelines against the diffusers pipeline's own output.

Requests are built from the same keyword arguments the reference `__call__` gets
(`DEFAULT_CALL_KWARGS[name]` plus overrides), so both sides always see the same inputs.
Outputs are compared as float arrays in [0, 1]: `decode_arrays` against `output_type="np"`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.pipelines.base import DenoiseState, DiffusionPipelineBase, DiffusionRequest

TOLERANCE = 1e-3

# Prompts of clearly different token lengths, for batches that need padding.
BATCH_PROMPTS = [
    "a cat",
    "a photo of a small dog sitting on a long red wooden chair in a sunny garden full of flowers",
    "a tree in the snow at night",
]
BATCH_SEEDS = [11, 22, 33]


def load_reference(pipeline_class: Any, path: Any, **components: Any) -> Any:
    """The diffusers pipeline in fp32 (`components` are passed instead of loaded)."""
    pipe = pipeline_class.from_pretrained(str(path), dtype=torch.float32, **components)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference_arrays(reference: Any, call_kwargs: dict[str, Any], seed: int) -> np.ndarray:
    """The diffusers pipeline's float output for `call_kwargs` and `seed` (CPU generator)."""
    out = reference(**call_kwargs, generator=torch.Generator("cpu").manual_seed(seed), output_type="np")
    return np.asarray(out.frames[0] if hasattr(out, "frames") else out.images)


def request_for(call_kwargs: dict[str, Any], seed: int, request_id: str = "req") -> DiffusionRequest:
    """The DiffusionRequest that carries the same inputs as diffusers `call_kwargs`."""
    kwargs = dict(call_kwargs)
    prompt = kwargs.pop("prompt")
    image = kwargs.pop("image", None)
    fields = {"num_outputs_per_prompt": kwargs.pop("num_images_per_prompt", 1)}
    for name in list(kwargs):
        if name in DiffusionParams.model_fields:
            fields[name] = kwargs.pop(name)
    params = DiffusionParams(seed=seed, extras=kwargs, **fields)  # whatever is left is an extra
    images = [] if image is None else (list(image) if isinstance(image, list) else [image])
    return DiffusionRequest(request_id=request_id, prompt=prompt, params=params, images=images)


def run_arrays(pipeline: DiffusionPipelineBase, requests: list[DiffusionRequest]) -> list[np.ndarray]:
    """All requests through one request-mode run (`denoise`, the body of `forward`), decoded to floats."""
    return pipeline.decode_arrays(pipeline.denoise(requests))


def run_staggered(pipeline: DiffusionPipelineBase, first: DiffusionRequest, second: DiffusionRequest,
                  join_after: int) -> list[np.ndarray]:
    """Step mode: `first` runs alone for `join_after` steps, then `second` is encoded and the
    two share every denoise_step call until each is done (each leaves when it finishes)."""
    states: list[DenoiseState] = pipeline.encode([first])
    for _ in range(join_after):
        pipeline.denoise_step(states)
    states += pipeline.encode([second])
    while any(not s.is_done for s in states):
        pipeline.denoise_step([s for s in states if not s.is_done])
    return pipeline.decode_arrays(states)


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, f"shape {a.shape} != reference {b.shape}"
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())
