"""Weight update bodies."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class UpdateWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stage: str | int
    """The stage to update, by name or id (`GET /v1/models` lists them)."""
    path: str
    """A checkpoint folder on the server: safetensors files named as the stage's weights (a diffusion
    stage: a pipeline folder whose component subfolders hold them; the ones present are updated)."""
    timeout_s: float = Field(300.0, gt=0)
    """Longest wait for the requests running now to finish on the old weights; requests arriving
    meanwhile wait and run on the new ones."""


class UpdateWeightsResponse(BaseModel):
    stage: str
    """The stage's name."""
    num_tensors: int
    """Tensors replaced (on each copy of the stage)."""
