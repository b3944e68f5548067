"""Fields of the video forms (multipart or urlencoded) and the OpenAI video job object.

A clip of `seconds` at `fps` has `round(seconds * fps) + 1` frames: the first frame
plus one per 1/fps (Wan's 81 frames are 5 s at 16 fps). `seconds` therefore needs `fps`;
or give `num_frames` directly.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from omnistage.entrypoints.openai import json_body
from omnistage.entrypoints.openai.common import DiffusionFields

VideoStatus = Literal["queued", "in_progress", "completed", "failed"]


class VideoCreateRequest(DiffusionFields):
    model: str | None = None
    prompt: str = Field(min_length=1, max_length=32000)
    size: str | None = None
    """'WIDTHxHEIGHT'; or give width and height."""
    width: int | None = Field(default=None, ge=1)
    height: int | None = Field(default=None, ge=1)
    num_frames: int | None = Field(default=None, ge=1, le=1024)
    seconds: float | None = Field(default=None, gt=0, le=600)
    fps: float | None = Field(default=None, gt=0, le=240)
    guidance_scale_2: float | None = Field(default=None, ge=0)
    extra_params: dict[str, Any] = Field(default_factory=dict)
    """Model extras as a JSON object, e.g. '{"max_sequence_length": 64}'."""
    user: str | None = None

    @field_validator("extra_params", mode="before")
    @classmethod
    def _parse_json(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = json_body.loads(value) if value.strip() else {}  # BadJSON is a ValueError: a 400 on the field
        else:
            json_body.check(value)
        if not isinstance(value, dict):
            raise ValueError("must be a JSON object")
        return value


class VideoJobRequest(VideoCreateRequest):
    """The form of `POST /v1/videos` and `/v1/videos/sync`: a video request, `n` times."""

    n: int = Field(default=1, ge=1)
    """Videos to make from the prompt (within the server's `max_n`); video i takes `seed + i`."""
    audio_reference: str | None = None
    """A JSON object {"audio_url": ...} for a family that conditions on audio; no served video
    family does, so it is a 400 naming it."""


REFUSED_FIELDS = {
    "num_outputs_per_prompt": "give n",
    "aspect_ratio": "give size (WIDTHxHEIGHT) or width and height",
    "short_edge": "give size (WIDTHxHEIGHT) or width and height",
    "vae_use_tiling": "VAE tiling is the stage's deploy setting `vae_use_tiling`, not a request field",
    "vae_use_slicing": "VAE slicing is the stage's deploy setting `vae_use_slicing`, not a request field",
    "preencode_mp4": "the server encodes each MP4 once its frames are made",
}
"""Fields the reference system's video forms take that this server does not, with what to do
instead: a 400 naming them (unknown fields would otherwise reach the model as extras)."""


class VideoError(BaseModel):
    code: str
    message: str


class VideoJob(BaseModel):
    """OpenAI's video object, plus `num_frames` and `fps` once known, and `n`."""

    id: str
    object: Literal["video"] = "video"
    model: str
    status: VideoStatus = "queued"
    progress: int = 0
    created_at: int
    completed_at: int | None = None
    expires_at: int | None = None
    prompt: str
    size: str | None = None
    seconds: str | None = None
    num_frames: int | None = None
    fps: float | None = None
    n: int = 1
    """Videos the job makes; `GET /v1/videos/{id}/content?index=i` fetches video i."""
    error: VideoError | None = None


class VideoList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VideoJob]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class VideoDeleted(BaseModel):
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool = True
