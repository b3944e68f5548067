"""What a request returns to the user, and how a stage's outputs fold into it.

`OmniOutput` is the one output type of `Omni` and `AsyncOmni`. A streamed request yields
several: each carries what is new (`text_delta`, `audio_chunk`, `video_chunk`, `progress`) and the
text so far; the last has `finished=True` and the whole media of every final stage
(one request may return text and audio). Fields that do not apply are None.

`StageStream` folds one stage's outputs for one request, in order, into the deltas and
the whole payload. A stage fed by streamed chunks runs one engine request per chunk
("part"); its whole payload joins the parts with `merge_payloads`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omnistage.core.errors import ErrorKind
from omnistage.core.types import AudioPayload, ImagePayload, LatentPayload, ProgressPayload, TextPayload, VideoPayload


@dataclass
class OmniOutput:
    request_id: str
    finished: bool = False
    text: str | None = None
    """Text so far (cumulative while streaming)."""
    token_ids: list[int] | None = None
    logprobs: list[Any] | None = None
    """`TokenLogprob` of every output token of the final text stage, when the request asked."""
    images: list[Any] | None = None
    """PIL images."""
    video: Any = None
    """np.ndarray uint8 [num_frames, H, W, 3]."""
    fps: float | None = None
    audio: Any = None
    """np.ndarray float32, mono: the whole waveform (on the finished output); beside `video`,
    its soundtrack, [channels, samples]."""
    sample_rate: int | None = None
    metrics: dict[str, Any] | None = None
    """{"e2e_time_s", "stages": {stage name: StageMetrics.as_dict()}} on the finished output."""
    finish_reason: str | None = None
    """"stop" | "length" from a text stage; "abort" when aborted; "error" with `error`."""
    error: str | None = None
    """Why the request failed, naming the stage."""
    error_kind: ErrorKind | None = None
    """INVALID_REQUEST when a stage refused the request's inputs or params; UNAVAILABLE
    when a stage is down or restarting, or the engine is stopping (retry later); else None."""
    error_param: str | None = None
    """With INVALID_REQUEST: the request field at fault, when the stage named it."""
    # --- what is new in a streamed output ---
    stage: str | None = None
    """Name of the stage this update came from."""
    text_delta: str | None = None
    logprobs_delta: list[Any] | None = None
    """`TokenLogprob` of the tokens this update added (may lead `text_delta`: text is held
    back while it could be the start of a stop string)."""
    audio_chunk: Any = None
    video_chunk: VideoPayload | None = None
    """The next frames of a video made in chunks (Helios; `is_chunk`); the finished output's
    `video` holds them all."""
    progress: ProgressPayload | None = None
    """Denoising progress (step, num_steps, optional PIL preview)."""


@dataclass
class Delta:
    """What one stage output adds for the user."""

    text: str | None = None
    text_delta: str | None = None
    logprobs: list[Any] | None = None
    audio_chunk: Any = None
    sample_rate: int | None = None
    video_chunk: VideoPayload | None = None
    progress: ProgressPayload | None = None

    @property
    def is_empty(self) -> bool:
        return (self.text_delta is None and not self.logprobs and self.audio_chunk is None
                and self.video_chunk is None and self.progress is None)


@dataclass
class StageStream:
    """One request's outputs from one stage, folded in order."""

    parts: list[Any] = field(default_factory=list)
    """The finished payload of each part (engine request), in order."""
    text: str | None = None
    """The stage's text so far, if it makes text."""
    _text_prefix: str = ""
    _chunks: list[Any] = field(default_factory=list)  # audio chunks of the unfinished part

    def add(self, payload: Any, part_finished: bool) -> Delta:
        delta = self._delta(payload)
        if part_finished:
            if isinstance(payload, AudioPayload) and payload.is_chunk:
                payload = merge_payloads([AudioPayload(c, payload.sample_rate, True) for c in self._chunks])
            if payload is not None and not isinstance(payload, ProgressPayload):
                self.parts.append(payload)
                if isinstance(payload, TextPayload):
                    self._text_prefix += payload.text
            self._chunks = []
        return delta

    def _delta(self, payload: Any) -> Delta:
        if isinstance(payload, ProgressPayload):
            return Delta(progress=payload)
        if isinstance(payload, TextPayload):
            self.text = self._text_prefix + payload.text
            return Delta(text=self.text, text_delta=payload.delta_text or None, logprobs=payload.delta_logprobs)
        if isinstance(payload, AudioPayload):
            if payload.is_chunk:
                self._chunks.append(payload.audio)
                return Delta(audio_chunk=payload.audio, sample_rate=payload.sample_rate)
            num_sent = sum(len(c) for c in self._chunks)
            rest = payload.audio[num_sent:]
            return Delta(audio_chunk=rest if len(rest) else None, sample_rate=payload.sample_rate)
        if isinstance(payload, VideoPayload) and payload.is_chunk:
            return Delta(video_chunk=payload)
        return Delta()

    def whole(self) -> Any:
        """The stage's whole payload for this request (None if it produced nothing)."""
        return merge_payloads(self.parts)


def merge_payloads(parts: list[Any]) -> Any:
    """Join the payloads of consecutive parts of one stream into one payload."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    kinds = {type(p) for p in parts}
    if len(kinds) != 1:
        raise TypeError(f"cannot merge payloads of different types: {sorted(k.__name__ for k in kinds)}")
    first, last = parts[0], parts[-1]
    if isinstance(first, TextPayload):
        hidden = [p.hidden_states for p in parts]
        return TextPayload(
            token_ids=[t for p in parts for t in p.token_ids],
            text="".join(p.text for p in parts),
            hidden_states=_concat(hidden) if all(h is not None for h in hidden) else None,
            finish_reason=last.finish_reason,
            extras=dict(last.extras),
            logprobs=[lp for p in parts for lp in p.logprobs] if all(p.logprobs is not None for p in parts) else None,
        )
    if isinstance(first, AudioPayload):
        return AudioPayload(_concat([p.audio for p in parts]), first.sample_rate, is_chunk=False)
    if isinstance(first, ImagePayload):
        return ImagePayload([image for p in parts for image in p.images])
    if isinstance(first, VideoPayload):
        import numpy as np

        audio = [p.audio for p in parts]
        soundtrack = np.concatenate(audio, axis=-1) if all(a is not None for a in audio) else None
        return VideoPayload(_concat([p.frames for p in parts]), first.fps, soundtrack, first.sample_rate)
    if isinstance(first, LatentPayload):
        raise TypeError("a latent stream has no natural join; give the stage a whole-payload edge")
    raise TypeError(f"cannot merge payloads of type {type(first).__name__}")


def _concat(arrays: list[Any]) -> Any:
    if type(arrays[0]).__module__.startswith("torch"):
        import torch

        return torch.cat(arrays)
    import numpy as np

    return np.concatenate(arrays)


def fill_media(out: OmniOutput, payload: Any) -> None:
    """Set the user-facing fields of `out` from a stage's whole payload."""
    if isinstance(payload, TextPayload):
        out.text, out.token_ids, out.logprobs = payload.text, list(payload.token_ids), payload.logprobs
        out.finish_reason = out.finish_reason or payload.finish_reason
    elif isinstance(payload, ImagePayload):
        out.images = list(payload.images)
    elif isinstance(payload, VideoPayload):
        out.video, out.fps = payload.frames, payload.fps
        if payload.audio is not None:  # the video's soundtrack (LTX-2)
            out.audio, out.sample_rate = payload.audio, payload.sample_rate
    elif isinstance(payload, AudioPayload):
        out.audio, out.sample_rate = payload.audio, payload.sample_rate
