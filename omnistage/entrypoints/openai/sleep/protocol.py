"""Sleep and wake bodies."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class SleepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    level: Literal[1, 2] = 1
    """1: every stage's weights moved to host memory and its caches freed. 2: the weights' storage
    freed too; wake-up reads them back from the checkpoint."""
    timeout_s: float = 300.0
    """Longest wait for the requests running now to finish before the stages sleep; new ones are
    refused (503 + Retry-After) from the moment this request arrives."""


class SleepState(BaseModel):
    is_sleeping: bool
    level: int | None = None
    """The level the stages sleep at; null while awake."""
    freed_bytes: int | None = None
    """What the sleep freed on the devices (weights moved off the device, caches dropped); set by
    POST /v1/omni/sleep."""
