"""The frames of a video chat session: decoded, filtered for near repeats, buffered until a query.

The near-duplicate filter compares a small grey thumbnail of each frame with the last frame
kept (a cheap frame difference, as the reference's EVS filter): a camera pointed at a still
scene sends the model one frame, not fifty equal ones.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from PIL import Image

THUMBNAIL = (32, 32)


@dataclass
class Frame:
    id: str
    pixels: np.ndarray
    """uint8 [H, W, 3]."""
    pts_ms: int | None
    thumbnail: np.ndarray
    """float32 grey THUMBNAIL in [0, 1]: what the filter compares."""


def make_frame(image: Image.Image, frame_id: str, pts_ms: int | None) -> Frame:
    """A decoded RGB image as a frame (in a worker thread: it resizes)."""
    thumb = np.asarray(image.convert("L").resize(THUMBNAIL, Image.BILINEAR), dtype=np.float32) / 255.0
    return Frame(frame_id, np.asarray(image.convert("RGB")), pts_ms, thumb)


def similarity(a: Frame, b: Frame) -> float:
    """1 - the mean absolute difference of the thumbnails: 1.0 for equal frames."""
    return 1.0 - float(np.abs(a.thumbnail - b.thumbnail).mean())


class FrameBuffer:
    """Frames received and not yet taken by a query, oldest first."""

    def __init__(self) -> None:
        self.frames: deque[Frame] = deque()
        self.last_kept: Frame | None = None
        self.num_received = 0

    def __len__(self) -> int:
        return len(self.frames)

    def is_repeat(self, frame: Frame, threshold: float | None) -> bool:
        """Is `frame` a near repeat of the last kept one? (None: the filter is off.)"""
        return threshold is not None and self.last_kept is not None and similarity(frame, self.last_kept) >= threshold

    def add(self, frame: Frame) -> None:
        self.frames.append(frame)
        self.last_kept = frame

    def peek(self, n: int) -> list[Frame]:
        """The `n` oldest frames: what the next query takes."""
        return [self.frames[i] for i in range(min(n, len(self.frames)))]

    def take(self, n: int) -> list[Frame]:
        return [self.frames.popleft() for _ in range(min(n, len(self.frames)))]
