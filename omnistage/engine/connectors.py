"""Connectors: how payloads cross a process boundary between the orchestrator and a stage.

The orchestrator is the hub of the stage graph: every payload goes stage -> orchestrator
(which runs the input processors) -> next stage. Inline stages live in the orchestrator's
process and get objects by reference, so no connector is involved. A process stage
sends and receives through its handle's connector:

- `inline`: the payload travels inside the control message (pickled into the pipe).
- `shm`: payloads whose serialized size reaches `threshold_bytes` (default 64 KiB) are
  written once into a named shared-memory segment and only a small `ShmEnvelope` travels
  in the message; smaller payloads travel inline. Tensors, numpy arrays and PIL images
  are written as raw buffers (pickle protocol 5, out of band), not re-encoded.

`put(obj)` returns what to send; `get(sent)` returns the object. A segment is unlinked
by the `get` that reads it, so it lives exactly as long as its message is in flight.
Segments a reader never gets to (the stage process crashed, the pipe closed) are freed
by `sweep()`: every segment name starts with the connector's `prefix`, and the owner of
both ends (the stage handle) sweeps both prefixes when the stage stops or dies.

- `ray`: for `runtime: ray` stages, which may sit on other machines. Payloads whose
  serialized size reaches `threshold_bytes` go into the Ray object store once (`ray.put`)
  and only a `RayEnvelope` holding the object ref travels in the actor call; tensors,
  arrays and images go in as raw numpy buffers, which Ray stores without pickling them.
  Ray frees an object when its last reference goes, so there is nothing to sweep.

NOTE: tensors arrive on the CPU, detached; the receiving engine moves them to its device.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

DEFAULT_SHM_THRESHOLD_BYTES = 64 * 1024
_SHM_DIR = "/dev/shm"  # where POSIX shared memory names are listed (Linux)


class Connector:
    """Base: sends objects inline. Subclasses move large payloads out of band."""

    name = "inline"

    def put(self, obj: Any) -> Any:
        return obj

    def get(self, sent: Any) -> Any:
        return sent

    def sweep(self) -> int:
        """Free every resource this connector created that no reader consumed; return how many."""
        return 0


InlineConnector = Connector


@dataclass(frozen=True)
class ShmEnvelope:
    """What travels in the message for a payload that went through shared memory."""

    name: str
    header_size: int
    buffer_sizes: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.header_size + sum(self.buffer_sizes)


class ShmConnector(Connector):
    name = "shm"

    def __init__(self, prefix: str, threshold_bytes: int = DEFAULT_SHM_THRESHOLD_BYTES):
        self.prefix = prefix
        self.threshold_bytes = threshold_bytes
        self._num_created = 0

    def put(self, obj: Any) -> Any:
        header, buffers = serialize(obj)
        sizes = tuple(b.nbytes for b in buffers)
        if len(header) + sum(sizes) < self.threshold_bytes:
            return obj
        envelope = ShmEnvelope(f"{self.prefix}{self._num_created}", len(header), sizes)
        self._num_created += 1
        shm = shared_memory.SharedMemory(envelope.name, create=True, size=max(envelope.nbytes, 1))
        try:
            offset = _write(shm.buf, 0, header)
            for buf in buffers:
                offset = _write(shm.buf, offset, buf)
        except BaseException:
            shm.close()
            shm.unlink()
            raise
        shm.close()
        return envelope

    def get(self, sent: Any) -> Any:
        if not isinstance(sent, ShmEnvelope):
            return sent
        shm = shared_memory.SharedMemory(sent.name)
        try:
            header = _read(shm.buf, 0, sent.header_size)
            offset, buffers = sent.header_size, []
            for size in sent.buffer_sizes:
                buffers.append(_read(shm.buf, offset, size))
                offset += size
        finally:
            shm.close()
            shm.unlink()
        return pickle.loads(header, buffers=buffers)

    def sweep(self) -> int:
        return sweep_segments(self.prefix)


@dataclass(frozen=True)
class RayEnvelope:
    """What travels in the call for a payload that went through the Ray object store."""

    ref: Any
    """ray.ObjectRef of (pickle header, [numpy uint8 buffers])."""


class RayConnector(Connector):
    name = "ray"

    def __init__(self, threshold_bytes: int = DEFAULT_SHM_THRESHOLD_BYTES, address: str | None = None):
        self.threshold_bytes = threshold_bytes
        self.address = address  # the cluster to join in a process that has not joined one yet

    def put(self, obj: Any) -> Any:
        import numpy as np

        header, buffers = serialize(obj)
        if len(header) + sum(b.nbytes for b in buffers) < self.threshold_bytes:
            return obj
        ray = self._ray()
        return RayEnvelope(ray.put((header, [np.frombuffer(b, np.uint8) for b in buffers])))

    def get(self, sent: Any) -> Any:
        if not isinstance(sent, RayEnvelope):
            return sent
        header, arrays = self._ray().get(sent.ref)
        # Ray hands back read-only views of its store; the receiver owns (and may write) a copy.
        return pickle.loads(header, buffers=[bytearray(a) for a in arrays])

    def _ray(self) -> Any:
        from omnistage.engine import ray_utils

        ray_utils.ensure_ray(self.address)
        return ray_utils.import_ray()


def make_connector(name: str, prefix: str, threshold_bytes: int = DEFAULT_SHM_THRESHOLD_BYTES,
                   ray_address: str | None = None) -> Connector:
    """The connector called `name` ("inline" | "shm" | "ray"); `prefix` names its shm segments,
    `ray_address` is the cluster the ray connector joins."""
    if name == "inline":
        return Connector()
    if name == "shm":
        return ShmConnector(prefix, threshold_bytes)
    if name == "ray":
        return RayConnector(threshold_bytes, ray_address)
    raise ValueError(f"unknown connector {name!r}; valid: inline, shm, ray")


def sweep_segments(prefix: str) -> int:
    """Unlink every shared-memory segment whose name starts with `prefix`.

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


# --- serialization: pickle protocol 5 with raw buffers out of band ---------------------

def serialize(obj: Any) -> tuple[bytes, list[memoryview]]:
    """Pickle `obj`; large buffers (arrays, tensors, images) come back apart, uncopied."""
    buffers: list[memoryview] = []
    out = io.BytesIO()
    _Pickler(out, buffers).dump(obj)
    return out.getvalue(), buffers


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, buffers: list[memoryview]):
        super().__init__(file, protocol=5, buffer_callback=lambda b: buffers.append(b.raw()))

    def reducer_override(self, obj: Any) -> Any:
        # torch pickles a tensor's storage in band (through torch.save), and PIL pickles
        # image bytes in band; give both as numpy/raw buffers so they go out of band.
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            t = obj.detach().to("cpu").contiguous()
            return _rebuild_tensor, (t.reshape(-1).view(torch.uint8).numpy(), t.dtype, tuple(t.shape))
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


def _write(buf: memoryview, offset: int, data: Any) -> int:
    view = memoryview(data).cast("B")
    buf[offset:offset + view.nbytes] = view
    return offset + view.nbytes


def _read(buf: memoryview, offset: int, size: int) -> bytearray:
    view = buf[offset:offset + size]
    try:
        return bytearray(view)
    finally:
        view.release()  # shm.close() refuses while a view of its buffer is alive
