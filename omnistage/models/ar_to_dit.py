"""Stage-input helpers shared by AR -> DiT families (GLM-Image; BAGEL-like ones next).

Such a family is two stages of one pipeline: an AR stage writes tokens that condition a
diffusion stage. The user talks to the pipeline as to an image model: a prompt and one
`DiffusionParams` (size, steps, seed), which the orchestrator hands to the diffusion
stage. These helpers let the AR stage's processor read what it needs of those params, run
the AR stage with the image's seed, and hand the tokens on as the diffusion request's
`condition` (see `omnistage.diffusion.inputs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omnistage.core.errors import RequestError
from omnistage.core.types import StageInputs, TextPayload


def user_prompt(request: Any) -> str:
    """The prompt of an image request: a str, or {"prompt": str}."""
    prompt = request.prompt.get("prompt") if isinstance(request.prompt, Mapping) else request.prompt
    if isinstance(request.prompt, Mapping) and request.prompt.get("image") is not None:
        raise RequestError("image", "image: this model takes a text prompt only")
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("prompt", f"prompt must be a non-empty string (or {{'prompt': str}}), got {request.prompt!r}")
    return prompt


def diffusion_params(request: Any, stage_id: int) -> Any:
    """The request's DiffusionParams for the diffusion stage `stage_id` (empty ones when none)."""
    from omnistage.diffusion.params import DiffusionParams

    params = request.params.get(stage_id)
    return params if params is not None else DiffusionParams()


def seeded_ar_inputs(inputs: Any, seed: int | None, **params: Any) -> StageInputs:
    """AR stage inputs that run with `seed` (the image's) and `params` (e.g. max_tokens) over the
    stage's defaults when the user gave that stage no params of its own, as reference
    pipelines seed their `generate` from the image generator."""
    from omnistage.ar.sampling_params import SamplingParams

    return StageInputs(inputs, SamplingParams(seed=seed, **params))


def generated_tokens(payload: Any) -> list[int]:
    """The finished AR payload's tokens; refuses an aborted or failed one."""
    if not isinstance(payload, TextPayload):
        raise TypeError(f"expected the AR stage's TextPayload, got {type(payload).__name__}")
    if payload.finish_reason == "abort":
        raise ValueError("the AR stage was aborted before it wrote its tokens")
    return list(payload.token_ids)


def dit_inputs(prompt: str, **condition: Any) -> dict[str, Any]:
    """The diffusion stage's inputs: the prompt, conditioned on what the AR stage wrote."""
    return {"prompt": prompt, "condition": condition}
