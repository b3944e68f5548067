"""GLM-Image's stage processors: the user's prompt -> the prior's inputs -> the DiT's inputs.

The user asks for an image: a prompt and one `DiffusionParams`, which go to the DiT stage.
The prior reads the target size and seed from those params (DEFAULT_SIZE when no size is
given, the DiT's default too), so both stages agree on the grid; the DiT gets the
prior's target grid, upsampled, as `condition["prior_token_ids"]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omnistage.core.errors import RequestError
from omnistage.models.ar_to_dit import diffusion_params, dit_inputs, generated_tokens, seeded_ar_inputs, user_prompt
from omnistage.models.glm_image.grid import DEFAULT_SIZE, PIXELS_PER_TOKEN, prior_grid

PRIOR, DIT = 0, 1


def _size(request: Any) -> tuple[int, int]:
    params = diffusion_params(request, DIT)
    size = {"height": params.height or DEFAULT_SIZE, "width": params.width or DEFAULT_SIZE}
    for name, value in size.items():  # checked before the prior runs (the DiT checks it again)
        if value % PIXELS_PER_TOKEN:
            raise RequestError(name, f"{name} must be divisible by {PIXELS_PER_TOKEN}, got {value}")
    return size["height"], size["width"]


def prior_inputs(request: Any, upstream: Mapping[int, Any]) -> Any:
    height, width = _size(request)
    inputs = {"prompt": user_prompt(request), "height": height, "width": width}
    max_tokens = prior_grid(height, width).num_new_tokens  # generate()'s max_new_tokens
    return seeded_ar_inputs(inputs, diffusion_params(request, DIT).seed, max_tokens=max_tokens)


def dit_stage_inputs(request: Any, upstream: Mapping[int, Any]) -> dict[str, Any]:
    height, width = _size(request)
    tokens = generated_tokens(upstream[PRIOR])
    return dit_inputs(user_prompt(request), prior_token_ids=prior_grid(height, width).dit_prior_tokens(tokens))
