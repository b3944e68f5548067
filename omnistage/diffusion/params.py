"""User-facing diffusion request parameters, validated at the edge.

`DiffusionParams` holds the prompt-level fields every diffusion model understands; a
field left as None takes the pipeline's default. Model-specific knobs go in `extras`
and are checked against the extras the pipeline declares (`ExtraSpec`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from omnistage.core.errors import RequestError
from omnistage.core.lora import LoraRequest


class DiffusionParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    negative_prompt: str | None = None
    height: int | None = Field(default=None, ge=8, le=8192)
    width: int | None = Field(default=None, ge=8, le=8192)
    num_frames: int | None = Field(default=None, ge=1, le=1024)
    fps: float | None = Field(default=None, gt=0, le=240)
    num_inference_steps: int | None = Field(default=None, ge=1, le=1000)
    guidance_scale: float | None = Field(default=None, ge=0)
    true_cfg_scale: float | None = Field(default=None, ge=0)
    guidance_scale_2: float | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    num_outputs_per_prompt: int = Field(default=1, ge=1, le=16)
    partial_images: int = Field(default=0, ge=0, le=3)
    """Previews decoded at evenly spaced steps and sent on the progress events (OpenAI's
    `partial_images`, 0-3); the final image is not counted."""
    lora: LoraRequest | None = None
    """A preloaded LoRA adapter for this request, e.g. {"name": "style", "scale": 0.8}."""
    extras: dict[str, Any] = Field(default_factory=dict)
    """Model-declared extras, e.g. {"max_sequence_length": 64}; unknown names are rejected."""

    def with_defaults(self, defaults: dict[str, Any]) -> "DiffusionParams":
        """Fill fields left as None (and missing extras) from `defaults`."""
        updates = {k: v for k, v in defaults.items() if k != "extras" and getattr(self, k, None) is None}
        extras = {**defaults.get("extras", {}), **self.extras}
        return self.model_copy(update={**updates, "extras": extras})


@dataclass(frozen=True)
class ExtraSpec:
    """A model-declared request extra: its type, default and allowed range."""

    type: type
    default: Any = None
    min: float | None = None
    max: float | None = None
    choices: tuple[Any, ...] | None = None
    help: str = ""
    max_from: tuple[str, ...] = ()
    """Checkpoint components whose token limit also caps the value (a tokenizer's
    `model_max_length`, a text encoder's positions): `max_sequence_length` beyond what the
    text encoder was built for costs memory quadratically and can panic the tokenizer."""

    def bounded_by(self, limit: int | None) -> "ExtraSpec":
        """This spec with `max` (and a default above it) lowered to `limit` (None: unchanged)."""
        if limit is None or (self.max is not None and self.max <= limit):
            return self
        default = min(self.default, limit) if isinstance(self.default, (int, float)) else self.default
        return dataclasses.replace(self, max=limit, default=default)

    def check(self, name: str, value: Any) -> Any:
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value) if abs(value) < 2**63 else math.inf  # 10**400 would raise OverflowError
        if not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            raise RequestError(name, f"extras.{name} must be {self.type.__name__}, got {type(value).__name__}")
        if self.min is not None and value < self.min:
            raise RequestError(name, f"extras.{name} must be >= {self.min}, got {value}")
        if self.max is not None and value > self.max:
            raise RequestError(name, f"extras.{name} must be <= {self.max}, got {value}")
        if self.type is int and not -2**63 <= value < 2**63:
            raise RequestError(name, f"extras.{name} must fit a 64-bit integer, got {value}")
        if self.type is float and not math.isfinite(value):
            raise RequestError(name, f"extras.{name} must be a finite number, got {value}")
        if self.choices is not None and value not in self.choices:
            raise RequestError(name, f"extras.{name} must be one of {list(self.choices)}, got {value!r}")
        return value


def fill_defaults(params: DiffusionParams, *layers: dict[str, Any]) -> DiffusionParams:
    """`params` with every field it leaves unset (None, or an extra it does not give) taken from
    the first of `layers` that gives it: the one place a request's defaults are filled. The
    engine passes the deploy's `default_sampling_params`, then the family's `request_defaults()`."""
    for layer in layers:
        params = params.with_defaults(layer)
    return params


def validate_extras(extras: dict[str, Any], schema: dict[str, ExtraSpec]) -> dict[str, Any]:
    """Check `extras` against `schema` (their declared defaults are filled by `fill_defaults`)."""
    unknown = sorted(set(extras) - set(schema))
    if unknown:
        known = ", ".join(sorted(schema)) or "none"
        raise RequestError(unknown[0], f"unknown extras {unknown}; this model accepts: {known}")
    return {name: schema[name].check(name, value) for name, value in extras.items()}
