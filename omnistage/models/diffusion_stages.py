"""What pipelines of several diffusion stages share (SDXL base + refiner, LTX-2 two-stage): each
stage's input processor gives its stage the user's prompt text, next to what the stage before handed on."""

from collections.abc import Mapping
from typing import Any


def prompt_of(request: Any) -> str:
    """The request's prompt text: its prompt string, or the "prompt" of a {"prompt": ...} dict."""
    prompt = request.prompt.get("prompt") if isinstance(request.prompt, Mapping) else request.prompt
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a string (or {{'prompt': str}}), got {request.prompt!r}")
    return prompt
