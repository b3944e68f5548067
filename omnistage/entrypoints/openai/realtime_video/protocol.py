"""Client messages of WS /v1/realtime/video (JSON text messages, told apart by `type`).

`session.start` takes the fields of a video job (`POST /v1/videos`: prompt, size or
width/height, num_frames or seconds, fps, seed, num_inference_steps, model extras, ...) plus
`format`, of which "m4s" (fragmented MP4) is the only one.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from omnistage.entrypoints.openai.videos.protocol import VideoCreateRequest


class SessionStart(VideoCreateRequest):
    type: Literal["session.start"]
    format: Literal["m4s"] = "m4s"


class InteractionEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=32000)


class Interaction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event_id: str = Field(min_length=1, max_length=256)
    event: InteractionEvent
    transition_chunks: int = Field(default=0, ge=0, le=64)
    """0: the new prompt holds from the next chunk; N: it is reached over the next N chunks,
    the prompt embeddings moving to it linearly (1/N, 2/N, ..., 1)."""


class SessionInteraction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["session.interaction"]
    interaction: Interaction


class SessionPing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["session.ping"]


class SessionStop(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["session.stop"]


ClientMessage = Annotated[SessionStart | SessionInteraction | SessionPing | SessionStop, Field(discriminator="type")]
