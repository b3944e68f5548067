"""Channel: how any object crosses a process or node boundary, written once.

Stage handles (orchestrator <-> stage process or Ray actor) and diffusion executors
(engine <-> worker processes) both send through a `Channel`: `put(obj)` returns a small
`Packed` to send through the pipe, queue or actor call, and `get(packed)` on the other side
returns the object.

One serializer: pickle protocol 5 with large buffers out of band. Tensors, numpy arrays
and PIL images go out as raw buffers, never re-encoded. Tensors are always moved to the
CPU and detached first, whatever their size, so the receiver never gets a CUDA tensor by
accident (which would create a CUDA context in the orchestrator, or fail on a Ray head
without a GPU); the receiving engine moves them to its device.

Where the out-of-band buffers travel is the transport; below `threshold_bytes` (one
default, 64 KiB) they always travel inside the `Packed` itself:
- `inline`: always inside the `Packed`.
- `shm`: above the threshold, in one named shared-memory segment, unlinked by the `get`
  that reads it. A segment a reader never got to (its process died) is freed by
  `sweep_shm(prefix)`: every segment name starts with the channel's `prefix`.
- `ray`: above the threshold, in the Ray object store (`ray.put`), for stages on other
  machines; Ray frees an object when its last reference goes, so nothing is swept.
"""

from __future__ import annotations

import io
import itertools
import os
import pickle
import sys
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

DEFAULT_THRESHOLD_BYTES = 64 * 1024
TRANSPORTS = ("inline", "shm", "ray")
_SHM_DIR = "/dev/shm"  # where POSIX shared memory names are listed (Linux)


@dataclass(frozen=True)
class Packed:
    """What travels for one object: the pickle and where its out-of-band buffers are."""

    header: bytes
    """The pickle (empty when it travels out of band with the buffers)."""
    buffers: tuple[bytes, ...] = ()
    """The buffers themselves (small objects, or the inline transport)."""
    segment: str | None = None
    """The shared-memory segment holding the pickle and the buffers back to back (shm transport)."""
    sizes: tuple[int, ...] = ()
    """Sizes of the pickle and the buffers in `segment` or behind `ref`."""
    ref: Any = None
    """ray.ObjectRef of the pickle and the buffers as numpy uint8 arrays (ray transport)."""


class Channel:
    """One end of a boundary (see the module docstring). `prefix` names shm segments."""

    def __init__(self, transport: str = "shm", prefix: str = "", threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
                 ray_address: str | None = None):
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}; valid: {', '.join(TRANSPORTS)}")
        if transport == "shm" and not prefix:
            raise ValueError("the shm transport needs a segment prefix (to sweep what a dead reader left)")
        self.transport = transport
        self.prefix = prefix
        self.threshold_bytes = threshold_bytes
        self.ray_address = ray_address  # the cluster to join in a process that has not joined one yet
        self._counter = itertools.count()

    def put(self, obj: Any) -> Packed:
        header, buffers = serialize(obj)
        if self.transport == "inline" or len(header) + sum(b.nbytes for b in buffers) < self.threshold_bytes:
            return Packed(header, tuple(bytes(b) for b in buffers))
        parts = [memoryview(header), *buffers]  # out of band, the pickle goes along (bytes pickle in band)
        sizes = tuple(p.nbytes for p in parts)
        if self.transport == "shm":
            return Packed(b"", segment=self._write_segment(parts, sizes), sizes=sizes)
        import numpy as np

        from omnistage.runtime import ray as ray_runtime

        ray = ray_runtime.joined(self.ray_address)
        return Packed(b"", sizes=sizes, ref=ray.put([np.frombuffer(p, np.uint8) for p in parts]))

    def get(self, packed: Packed) -> Any:
        return unpack(packed)

    def sweep(self) -> int:
        """Free the segments this channel wrote that no reader consumed; return how many."""
        return sweep_shm(self.prefix) if self.transport == "shm" else 0

    def _write_segment(self, parts: list[memoryview], sizes: tuple[int, ...]) -> str:
        name = f"{self.prefix}{next(self._counter)}"
        shm = shared_memory.SharedMemory(name, create=True, size=max(sum(sizes), 1))
        try:
            offset = 0
            for buf, size in zip(parts, sizes):
                shm.buf[offset:offset + size] = buf.cast("B")
                offset += size
        except BaseException:
            shm.close()
            shm.unlink()
            raise
        shm.close()  # the reader unlinks it
        return name


def unpack(packed: Packed) -> Any:
    """Rebuild the object; the receiver owns (and may write) every buffer."""
    if packed.segment is not None:
        shm = shared_memory.SharedMemory(packed.segment)
        try:
            parts, offset = [], 0
            for size in packed.sizes:
                view = shm.buf[offset:offset + size]
                parts.append(bytearray(view))
                view.release()  # shm.close() refuses while a view of its buffer is alive
                offset += size
        finally:
            shm.close()
            shm.unlink()
    elif packed.ref is not None:
        from omnistage.runtime import ray as ray_runtime

        # Ray hands back read-only views of its store: copy.
        parts = [bytearray(a) for a in ray_runtime.import_ray().get(packed.ref)]
    else:
        parts = [packed.header, *(bytearray(b) for b in packed.buffers)]
    return pickle.loads(parts[0], buffers=parts[1:])


def sweep_shm(prefix: str) -> int:
    """Unlink every shared-memory segment whose name starts with `prefix`; return how many.

    Only Linux lists segments (in /dev/shm); elsewhere this frees nothing and Python's
    resource tracker unlinks leftovers when the interpreter exits.
    """
    if not prefix or not os.path.isdir(_SHM_DIR):
        return 0
    num_freed = 0
    for name in os.listdir(_SHM_DIR):
        if not name.startswith(prefix):
            continue
        try:
            shm = shared_memory.SharedMemory(name)
        except FileNotFoundError:
            continue  # a reader got to it first
        shm.close()
        try:
            shm.unlink()
            num_freed += 1
        except FileNotFoundError:
            pass
    return num_freed


# --- the serializer: pickle protocol 5 with raw buffers out of band ---------------------

def serialize(obj: Any) -> tuple[bytes, list[memoryview]]:
    """Pickle `obj`; large buffers (arrays, tensors, images) come back apart, uncopied."""
    buffers: list[memoryview] = []
    out = io.BytesIO()
    _Pickler(out, buffers).dump(obj)
    return out.getvalue(), buffers


def to_cpu(tensor: Any) -> Any:
    """The tensor on the CPU, detached and contiguous (a no-op copy-wise for CPU tensors)."""
    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")
    return tensor.detach().contiguous()


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, buffers: list[memoryview]):
        super().__init__(file, protocol=5, buffer_callback=lambda b: buffers.append(b.raw()))

    def reducer_override(self, obj: Any) -> Any:
        # torch pickles a tensor's storage in band (and keeps its device), PIL pickles image
        # bytes in band; both go out of band as raw buffers instead.
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            t = to_cpu(obj)
            return _rebuild_tensor, (t.reshape(-1).view(torch.uint8).numpy(), t.dtype, tuple(t.shape))
        numpy = sys.modules.get("numpy")
        if (numpy is not None and type(obj) is numpy.ndarray and not obj.dtype.hasobject
                and not (obj.flags.c_contiguous or obj.flags.f_contiguous)):
            return numpy.ascontiguousarray(obj).__reduce_ex__(5)  # numpy pickles a strided view in band
        image_module = sys.modules.get("PIL.Image")
        if image_module is not None and isinstance(obj, image_module.Image):
            palette = obj.getpalette() if obj.mode in ("P", "PA") else None
            return _rebuild_image, (obj.mode, obj.size, pickle.PickleBuffer(obj.tobytes()), palette, dict(obj.info))
        return NotImplemented


def _rebuild_tensor(data: Any, dtype: Any, shape: tuple[int, ...]) -> Any:
    import torch

    return torch.from_numpy(data).view(dtype).reshape(shape)


def _rebuild_image(mode: str, size: tuple[int, int], data: Any, palette: list[int] | None, info: dict) -> Any:
    from PIL import Image

    image = Image.frombytes(mode, size, data)
    if palette is not None:
        image.putpalette(palette)
    image.info.update(info)
    return image
