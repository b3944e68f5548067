"""The opening of every TTS family's request parsing: the request as a dict, its keys, its text.

A request is a str (the text to speak) or a dict of the family's keys (`prompt` the text;
`voice`, `instructions`, the reference clip's keys, as the family takes them). Each problem
is a RequestError naming the key (HTTP 400). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from omnistage.core.errors import RequestError


def speech_request(inputs: Any, family: str, keys: Sequence[str], refused: Sequence[str] = ()) -> Mapping[str, Any]:
    """`inputs` as a mapping of `keys`; `refused` keys pass here for the family to refuse with its reason."""
    if isinstance(inputs, str):
        inputs = {"prompt": inputs}
    if not isinstance(inputs, Mapping):
        raise RequestError("prompt", f"prompt: {family} takes a str or a dict with keys {list(keys)}, "
                                     f"got {type(inputs).__name__}")
    unknown = sorted(set(inputs) - set(keys) - set(refused))
    if unknown:
        raise RequestError(unknown[0], f"{unknown[0]}: unknown {family} prompt key; expected {list(keys)}")
    return inputs


def text_to_speak(inputs: Mapping[str, Any]) -> str:
    text = inputs.get("prompt")
    if not isinstance(text, str) or not text.strip():
        raise RequestError("prompt", "prompt: the text to speak must be a non-empty string")
    return text
