"""Request params of CSM's codec stage: how the talker's frames are cut into codec chunks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CsmCodecParams:
    """Pass as the "codec" entry of a request's params: `params={"codec": CsmCodecParams(...)}`.

    The first chunk is small so the first audio leaves early (time to first packet);
    later chunks are larger, so the codec runs fewer, fuller passes. At Mimi's 12.5
    frames/s, 2 frames are 160 ms of audio and 8 frames 640 ms.
    """

    first_chunk_frames: int = 2
    """Frames in the first chunk sent to the codec (>= 1)."""
    chunk_frames: int = 8
    """Frames in each later chunk (>= 1); the last chunk holds whatever is left."""

    def __post_init__(self) -> None:
        problems = [f"{name} must be an integer >= 1, got {getattr(self, name)!r}"
                    for name in ("first_chunk_frames", "chunk_frames")
                    if not isinstance(getattr(self, name), int) or getattr(self, name) < 1]
        if problems:
            raise ValueError("invalid CsmCodecParams: " + "; ".join(problems))

    def boundary(self, num_frames: int) -> int:
        """The last chunk boundary at or below `num_frames` (frames that fill whole chunks)."""
        if num_frames < self.first_chunk_frames:
            return 0
        return self.first_chunk_frames + (num_frames - self.first_chunk_frames) // self.chunk_frames * self.chunk_frames
