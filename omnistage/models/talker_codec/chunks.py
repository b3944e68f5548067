"""How a talker's frames are cut into codec chunks (run by the orchestrator, not the engines).

    talker ──FrameChunks (streamed)──> codec

Each chunk is one codec engine request, a "part" of stream `request_id`:

    {"codes": [frames, ...], "stream_id": request_id, "is_last": bool[, "options": {"context_codes": ...}]}

The codec stages keep each stream's state from part to part (convolution context, KV
cache, a lookahead), so the chunks need no overlap. Stateless: which frames were sent
before follows from the previous frame count (this one minus the step's new frames).
Torch-free: users and the server import the params cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FrameChunkParams:
    """Pass as the codec stage's entry of a request's params: `params={"codec": FrameChunkParams(...)}`.

    The first chunk is small so the first audio leaves early (time to first packet); later
    chunks are larger, so the codec runs fewer, fuller passes. A family declares its defaults
    (`TalkerCodec.chunking`); `CsmCodecParams` and `Code2WavParams` are the same params under
    the names CSM and Qwen3-Omni users know, and every family takes any of them.
    """

    first_chunk_frames: int = 5
    """Frames in the first chunk sent to the codec (>= 1)."""
    chunk_frames: int = 25
    """Frames in each later chunk (>= 1; the last chunk holds whatever is left), or 0 for one
    pass over the whole utterance once the talker has finished."""

    def __post_init__(self) -> None:
        problems = []
        for name, low in (("first_chunk_frames", 1), ("chunk_frames", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                problems.append(f"{name} must be an integer >= {low}, got {value!r}")
        if problems:
            raise ValueError(f"invalid {type(self).__name__}: " + "; ".join(problems))

    def boundary(self, num_frames: int) -> int:
        """The last chunk boundary at or below `num_frames` (frames that fill whole chunks)."""
        if self.chunk_frames == 0 or num_frames < self.first_chunk_frames:
            return 0
        return self.first_chunk_frames + (num_frames - self.first_chunk_frames) // self.chunk_frames * self.chunk_frames


@dataclass(frozen=True)
class FrameChunks:
    """A talker stage's chunk processor: its output so far -> the next part of the codec stream, or None.

    Chunk boundaries are at `first_chunk_frames`, then every `chunk_frames` frames; a chunk
    goes as soon as the frame count passes a boundary, and when the talker finishes, what is
    left goes in a last part (possibly empty: it closes the stream). A request without params
    for `codec_stage` gets `default`. A cloned voice's reference codes
    (`extras["context_codes"]`) ride along as the part's options: the codec decodes them first
    and drops their audio.
    """

    codec_stage: int
    default: FrameChunkParams = FrameChunkParams()

    def __call__(self, request: Any, payload: Any, finished: bool) -> dict | None:
        codes = payload.extras.get("audio_codes") if payload is not None else None
        if codes is None:
            return None  # an aborted or failed talker: the orchestrator drops the codec stream
        params = request.params.get(self.codec_stage) or self.default
        if not isinstance(params, FrameChunkParams):
            raise TypeError(f"codec params must be {type(self.default).__name__} (or any FrameChunkParams), "
                            f"got {type(params).__name__}")
        num_frames = codes.shape[0]
        sent = params.boundary(num_frames - payload.extras.get("num_new_frames", 0))
        end = num_frames if finished else params.boundary(num_frames)
        if end <= sent and not finished:
            return None
        part = {"codes": codes[sent:end].clone(), "stream_id": request.request_id, "is_last": finished}
        if payload.extras.get("context_codes") is not None:
            part["options"] = {"context_codes": payload.extras["context_codes"]}
        return part
