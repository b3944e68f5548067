"""Results back from worker processes over shared memory.

A result is pickled with protocol 5: numpy arrays (and PIL images, turned into uint8
arrays) go out-of-band into one `multiprocessing.shared_memory` segment; only the small
pickle travels through the pipe. The reader copies the buffers out and unlinks the
segment at once. Segment names carry a per-executor prefix so the executor can sweep
what a killed worker left behind (`unlink_all`).
"""

from __future__ import annotations

import io
import itertools
import os
import pickle
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

SHM_DIR = "/dev/shm"


def _image_from_array(array: np.ndarray) -> Any:
    from PIL import Image

    return Image.fromarray(array)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        from PIL import Image

        if isinstance(obj, Image.Image):
            return _image_from_array, (np.ascontiguousarray(np.asarray(obj)),)
        return NotImplemented


@dataclass
class Packed:
    data: bytes
    segment: str | None = None
    spans: tuple[tuple[int, int], ...] = ()


class ShmWriter:
    """Worker side: `pack(obj)` -> a small `Packed` to send through the pipe."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._counter = itertools.count()

    def pack(self, obj: Any) -> Packed:
        buffers: list[pickle.PickleBuffer] = []
        out = io.BytesIO()
        _Pickler(out, protocol=5, buffer_callback=buffers.append).dump(obj)
        if not buffers:
            return Packed(out.getvalue())
        views = [b.raw() for b in buffers]
        spans, offset = [], 0
        for view in views:
            spans.append((offset, view.nbytes))
            offset += view.nbytes
        name = f"{self.prefix}{next(self._counter)}"
        segment = shared_memory.SharedMemory(name=name, create=True, size=max(offset, 1))
        try:
            for view, (start, length) in zip(views, spans):
                segment.buf[start:start + length] = view
        finally:
            segment.close()  # the reader unlinks it
        return Packed(out.getvalue(), name, tuple(spans))


def unpack(packed: Packed) -> Any:
    """Reader side: rebuild the object, copying its arrays out of shared memory."""
    if packed.segment is None:
        return pickle.loads(packed.data)
    segment = shared_memory.SharedMemory(name=packed.segment)
    try:
        buffers = [bytearray(segment.buf[start:start + length]) for start, length in packed.spans]
    finally:
        segment.close()
        segment.unlink()
    return pickle.loads(packed.data, buffers=buffers)


def unlink_all(prefix: str) -> int:
    """Unlink every segment whose name starts with `prefix`; returns how many."""
    if not os.path.isdir(SHM_DIR):
        return 0
    count = 0
    for name in os.listdir(SHM_DIR):
        if name.startswith(prefix):
            try:
                shared_memory.SharedMemory(name=name).unlink()
                count += 1
            except FileNotFoundError:
                pass
    return count
