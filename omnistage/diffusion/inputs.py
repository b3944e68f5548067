"""Edge checks that turn a `StageRequest` into the pipeline's `DiffusionRequest`.

`inputs` is the user prompt: a str, or `{"prompt": str, "image": PIL | [PIL, ...]}` (and, for
a family that takes a control video, `"video"` and `"mask"`: lists of PIL frames), plus,
from an upstream stage, `"condition"`: a dict the family's pipeline reads (an AR -> DiT
hand-off, e.g. GLM-Image's prior image tokens; see `omnistage.models.ar_to_dit`);
`params` is `DiffusionParams`, a dict of its fields, or None. Every problem raises a
`RequestError` naming the field, before anything is queued. Model-dependent checks (sizes,
extras, whether an image is needed) run afterwards in the pipeline's `prepare_request`,
in the engine process, against the checkpoint's config files (`for_requests`).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Any

from omnistage.core.errors import RequestError
from omnistage.core.types import StageRequest
from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest

INPUT_KEYS = ("prompt", "image", "video", "mask", "condition")


def parse_prompt(inputs: Any) -> tuple[str, list[Any]]:
    if isinstance(inputs, str):
        return inputs, []
    if not isinstance(inputs, Mapping):
        raise RequestError("prompt", f"inputs must be a prompt string or a dict with keys {list(INPUT_KEYS)}, "
                           f"got {type(inputs).__name__}")
    unknown = sorted(set(inputs) - set(INPUT_KEYS))
    if unknown:
        raise RequestError(unknown[0], f"inputs: unknown keys {unknown}; allowed: {list(INPUT_KEYS)}")
    prompt = inputs.get("prompt")
    if not isinstance(prompt, str):
        raise RequestError("prompt", f"prompt must be a string, got {type(prompt).__name__}")
    return prompt, parse_images(inputs, "image")


def parse_images(inputs: Any, key: str) -> list[Any]:
    """`inputs[key]` as a list of PIL images (one image alone is a list of one; none: empty)."""
    from PIL import Image

    images = inputs.get(key) if isinstance(inputs, Mapping) else None
    if images is None:
        images = []
    elif not isinstance(images, (list, tuple)):
        images = [images]
    for i, image in enumerate(images):
        if not isinstance(image, Image.Image):
            raise RequestError(key, f"{key}[{i}] must be a PIL image, got {type(image).__name__}")
    return list(images)


def parse_params(params: Any) -> DiffusionParams:
    """The request's params as given (the pipeline's `prepare_request` fills the defaults)."""
    if params is None:
        return DiffusionParams()
    elif isinstance(params, Mapping):
        params = DiffusionParams(**params)  # pydantic's ValidationError is a ValueError naming the field
    elif not isinstance(params, DiffusionParams):
        raise RequestError(None, f"params must be DiffusionParams, got {type(params).__name__}")
    return params


def seeded(request: DiffusionRequest) -> DiffusionRequest:
    """`request` with a seed drawn when neither it nor the defaults gave one, so the result
    can be reproduced (the seed is in the metrics)."""
    if request.params.seed is not None:
        return request
    return dataclasses.replace(request, params=request.params.model_copy(update={"seed": random.randrange(2**63)}))


def check_default_params(defaults: Mapping[str, Any]) -> None:
    unknown = sorted(set(defaults) - set(DiffusionParams.model_fields))
    if unknown:
        raise ValueError(f"default_sampling_params: unknown DiffusionParams fields {unknown}")
    DiffusionParams(**defaults)


def parse_condition(inputs: Any) -> dict[str, Any]:
    condition = inputs.get("condition") if isinstance(inputs, Mapping) else None
    if condition is None:
        return {}
    if not isinstance(condition, Mapping):
        raise RequestError("condition", f"condition must be a dict, got {type(condition).__name__}")
    return dict(condition)


def to_diffusion_request(request: StageRequest) -> DiffusionRequest:
    if not isinstance(request.request_id, str) or not request.request_id:
        raise RequestError(None, "request_id must be a non-empty string")
    prompt, images = parse_prompt(request.inputs)
    return DiffusionRequest(request.request_id, prompt, parse_params(request.params), images,
                            video=parse_images(request.inputs, "video"), mask=parse_images(request.inputs, "mask"),
                            condition=parse_condition(request.inputs))


def freeze(value: Any) -> Any:
    """A hashable copy of a batch key (extras may hold dicts or lists, e.g. a LoRA spec)."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple, set)):
        return tuple(freeze(v) for v in value)
    return value
