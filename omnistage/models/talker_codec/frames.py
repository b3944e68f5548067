"""The frames a talker has made for one request, and what each step tells the chunker.

A talker keeps its request's frames in a `FrameBuffer` and returns `frame_extras(...)` from
`on_sampled` for each row: `extras["audio_codes"]` (every frame so far, [frames, *frame_shape]
on the CPU) and `extras["num_new_frames"]` (this step's), which `chunks.FrameChunks` cuts
into codec chunks.
"""

from __future__ import annotations

import torch


class FrameBuffer:
    """Frames of one request, appended one by one into a buffer that doubles when full.

    `codes()` is a view: earlier outputs keep views of an outgrown buffer, whose rows are final.
    """

    def __init__(self, frame_shape: tuple[int, ...], dtype: torch.dtype = torch.long, capacity: int = 64) -> None:
        self.frames = torch.zeros(capacity, *frame_shape, dtype=dtype)
        self.num_frames = 0

    def add(self, frame: torch.Tensor) -> None:
        if self.num_frames == self.frames.shape[0]:
            grown = self.frames.new_zeros(2 * self.num_frames, *self.frames.shape[1:])
            grown[:self.num_frames] = self.frames
            self.frames = grown
        self.frames[self.num_frames] = frame
        self.num_frames += 1

    def codes(self) -> torch.Tensor:
        return self.frames[:self.num_frames]


def frame_extras(frames: FrameBuffer, num_new: int, context: torch.Tensor | None = None) -> dict:
    """One row's `on_sampled` extras: the frames so far and how many this step added; `context`,
    a cloned voice's reference codes the codec decodes first (and cuts)."""
    extras = {"audio_codes": frames.codes(), "num_new_frames": num_new}
    if context is not None:
        extras["context_codes"] = context
    return extras
