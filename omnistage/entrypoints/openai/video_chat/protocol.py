"""Client events of WS /v1/video/chat/stream (JSON text messages, told apart by `type`).

Fields the server does not implement are refused by name (`extra="forbid"`), as on
WS /v1/realtime. Ranges and defaults follow the reference system's session config.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

Modality = Literal["text", "audio"]


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event_id: str | None = Field(None, max_length=64)


class SessionConfig(_Event):
    """`session.config`: every field optional; those given replace the session's."""

    type: Literal["session.config"]
    model: str | None = None
    modalities: list[Modality] | None = Field(None, min_length=1)
    """["text"], or ["text", "audio"] for spoken answers (an omni model's talker)."""
    num_frames: int | None = Field(None, ge=1, le=128)
    """The most buffered frames one query takes (the oldest first; the rest wait for the next)."""
    max_frames: int | None = Field(None, ge=1, le=256)
    """The most frames the session buffers that no query has taken; one more is an error."""
    system_prompt: str | None = Field(None, max_length=32000)
    use_audio_in_video: bool | None = None
    """Hear the stream's audio (`audio.chunk`) with its frames; false: audio chunks are refused."""
    sampling_params_list: list[dict[str, Any]] | None = None
    """Per AR stage, in the pipeline's order (thinker, then talker): its sampling params."""
    enable_frame_filter: bool | None = None
    """Drop a frame nearly equal to the last one kept (`frame_filter_threshold`)."""
    frame_filter_threshold: float | None = Field(None, ge=0.0, le=1.0)
    """Similarity (1 - mean absolute difference of small grey thumbnails, in [0, 1]) at or
    above which a frame counts as a repeat of the last kept one."""
    voice: str | None = None


class VideoFrame(_Event):
    type: Literal["video.frame"]
    image: str = Field(min_length=1)
    """A JPEG or PNG, base64 (or a base64 data URL)."""
    frame_id: str | None = Field(None, max_length=64)
    pts_ms: int | None = Field(None, ge=0)


class AudioChunk(_Event):
    type: Literal["audio.chunk"]
    audio: str
    """PCM16 little-endian mono at 24 kHz, base64 (WS /v1/realtime's `audio/pcm`)."""


class VideoQuery(_Event):
    type: Literal["video.query"]
    text: str | None = Field(None, max_length=32000)
    audio: str | None = None
    """The question spoken, as `audio.chunk`'s audio."""


ClientEvent = Union[SessionConfig, VideoFrame, AudioChunk, VideoQuery]
EVENTS: dict[str, type[_Event]] = {e.model_fields["type"].annotation.__args__[0]: e for e in ClientEvent.__args__}
