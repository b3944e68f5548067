"""The vision encoder's outputs per image, kept by the image's digest (shared by the Qwen omni thinkers).

A live video chat sends every query the frames of all turns before it (WS
/v1/video/chat/stream): the prefix cache holds their keys and values, and this cache their
encoder outputs, so a query encodes only the frames it has not seen. Bounded (least recently
used out first), per thinker: entries stay on the model's device.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

MAX_IMAGES = 128
"""Images kept: a session's buffered frames (max_frames <= 256 is the bound clients set) and more."""


@dataclass
class EncodedImage:
    grid: torch.Tensor
    """[3] (t, h, w) patches, as the image processor gives it."""
    features: torch.Tensor
    """[its tokens, H]: the encoder's merged output."""
    deepstack: list[torch.Tensor] | None = None
    """Per deepstack layer, [its tokens, H] (thinkers with deepstack vision features)."""


class EncoderCache:
    def __init__(self, max_images: int = MAX_IMAGES) -> None:
        self.max_images = max_images
        self._entries: OrderedDict[str, EncodedImage] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, digest: str) -> EncodedImage | None:
        entry = self._entries.get(digest)
        if entry is not None:
            self._entries.move_to_end(digest)
        return entry

    def put(self, digest: str, entry: EncodedImage) -> None:
        self._entries[digest] = entry
        self._entries.move_to_end(digest)
        while len(self._entries) > self.max_images:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
