"""Typed requests, payloads and outputs that cross the engine boundary.

Every engine (AR, diffusion, generation) takes `StageRequest`s and emits `StageOutput`s
whose payload is one of the typed payloads below. Engines never know which stage comes
next; the orchestrator routes payloads between stages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from omnistage.core.errors import ErrorKind


# --- payloads (what a stage produces) -------------------------------------------------

@dataclass
class TokenLogprob:
    """One output token's log-probability and the most likely alternatives at its position."""
    token_id: int
    token: str
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)  # (id, text, logprob), most likely first


@dataclass
class TextPayload:
    """AR output so far. `delta_*` is what this step added; the rest is cumulative."""
    token_ids: list[int]
    text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_text: str = ""
    hidden_states: Any = None  # torch.Tensor [num_tokens, hidden] when a downstream stage asked for it
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    extras: dict[str, Any] = field(default_factory=dict)  # model-specific tensors for the next stage
    logprobs: list[TokenLogprob] | None = None  # every output token's, on the finished payload (when asked)
    delta_logprobs: list[TokenLogprob] | None = None  # this step's tokens' (when asked)


@dataclass
class ImagePayload:
    images: list[Any]  # PIL.Image.Image


@dataclass
class VideoPayload:
    frames: Any  # np.ndarray uint8 [num_frames, H, W, 3]
    fps: float
    audio: Any = None  # np.ndarray float32 [channels, samples]: the soundtrack, when the model makes one (LTX-2)
    sample_rate: int | None = None  # of `audio`
    is_chunk: bool = False  # True for a streamed piece (Helios' chunks); the final payload holds the whole video
    events: dict[str, list[str]] | None = None
    """On a streamed piece of a request whose prompt was updated while it ran: the update
    event ids that "started", were "active" and "completed" in this piece."""


@dataclass
class AudioPayload:
    audio: Any  # np.ndarray float32, mono
    sample_rate: int
    is_chunk: bool = False  # True for a streamed piece; the final payload holds the whole waveform


@dataclass
class LatentPayload:
    latents: Any  # torch.Tensor
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProgressPayload:
    step: int
    num_steps: int
    preview: Any = None  # optional PIL preview of the current latents


# --- requests and outputs -----------------------------------------------------------------


@dataclass
class StageRequest:
    request_id: str
    inputs: Any  # built by the stage's input processor (e.g. {"prompt": str, "image": PIL} or token ids)
    params: Any = None  # DiffusionParams | SamplingParams | None (engine defaults)
    arrival_time: float = field(default_factory=time.monotonic)
    session_id: str | None = None  # a conversation or session: replicas route it by affinity
    stream_of: str | None = None  # one part of request X's streamed input: the parts stay on one replica


@dataclass
class StageInputs:
    """What an input processor may return instead of bare inputs: the inputs plus the params
    the stage runs with when the user gave that stage none (e.g. GLM-Image's AR prior draws
    its tokens with the image's seed, as the reference pipeline does)."""
    inputs: Any
    params: Any = None


@dataclass
class InputChunk:
    """`StageRequest.inputs` that continue a live request's inputs: a streamed upstream into an AR
    stage extends one running sequence instead of starting one request per chunk. Sent under
    the request's own id; an engine ignores it once that request has ended."""
    inputs: Any


@dataclass
class StageOutput:
    request_id: str
    payload: Any  # one of the payload types above, or None with an error
    finished: bool
    error: str | None = None
    error_kind: ErrorKind | None = None
    """With `error`: INVALID_REQUEST when the engine refused the request's inputs or params
    (a ValueError at add_request: the caller's mistake); UNAVAILABLE when the stage's
    engine died or is restarting (retry later); else None (the engine failed)."""
    error_param: str | None = None
    """With INVALID_REQUEST: the field at fault (`RequestError.param`), when known."""
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """What the orchestrator needs from every stage engine. Steps are driven by the caller."""

    def add_request(self, request: StageRequest) -> None: ...

    def abort_request(self, request_id: str) -> None: ...

    def step(self) -> list[StageOutput]:
        """Run one scheduling step; return the outputs it produced (possibly none)."""
        ...

    def has_unfinished_requests(self) -> bool: ...

    def is_healthy(self) -> bool: ...

    def close(self) -> None: ...
