"""Request params of CSM's codec stage: how the talker's frames are cut into codec chunks."""

from __future__ import annotations

from dataclasses import dataclass

from omnistage.models.talker_codec.chunks import FrameChunkParams


@dataclass(frozen=True)
class CsmCodecParams(FrameChunkParams):
    """Pass as the "codec" entry of a request's params: `params={"codec": CsmCodecParams(...)}`.

    `FrameChunkParams` with CSM's defaults: at Mimi's 12.5 frames/s, 2 frames are 160 ms of
    audio and 8 frames 640 ms.
    """

    first_chunk_frames: int = 2
    """Frames in the first chunk sent to the codec (>= 1)."""
    chunk_frames: int = 8
    """Frames in each later chunk (>= 1; the last chunk holds whatever is left), or 0 for one pass."""
