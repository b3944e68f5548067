"""One request as a diffusion pipeline sees it. Plain Python (no torch), so the batch
schedulers (`sched/`) and the engine's edge checks import it without loading torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omnistage.diffusion.params import DiffusionParams


@dataclass
class DiffusionRequest:
    """One request as a pipeline sees it: the prompt, its input media and its params."""

    request_id: str
    prompt: str
    params: DiffusionParams
    images: list[Any] = field(default_factory=list)  # input PIL images (edit, I2V, VACE's reference images)
    video: list[Any] = field(default_factory=list)
    """A control video's frames as PIL images (Wan-VACE); empty when none."""
    mask: list[Any] = field(default_factory=list)
    """The control video's mask frames as PIL images (white: generate, black: keep); empty when none."""
    condition: dict[str, Any] = field(default_factory=dict)
    """What an upstream stage conditions this request on (an AR -> DiT hand-off, e.g. GLM-Image's
    prior image tokens); the family's pipeline checks and reads it. Empty for a one-stage model."""
