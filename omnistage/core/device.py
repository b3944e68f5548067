"""Device and dtype for a stage engine, from its deploy fields (shared by every engine kind).

One rule for CUDA everywhere: a bare "cuda" is the current CUDA device, resolved here to its
index, so nothing downstream (set_device, nccl, memory stats) ever sees an index-less device.
In-process stages on different GPUs share one process-wide "current device": each runs its
work inside `device_scope(its device)` rather than calling `torch.cuda.set_device`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def canonical_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device with an index on CUDA: a bare "cuda" is the current device.
    Where CUDA is absent (a Ray head placing GPU actors) it stays bare: the process that runs
    on it resolves it again."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_devices(devices: Sequence[str], num_devices: int = 1) -> tuple[torch.device, ...]:
    """One device per rank (`StageDeployConfig.devices` / `num_devices`, which it checked agree):
    `devices` when set, else the current CUDA device onwards on a CUDA machine, else cpu."""
    if devices:
        return tuple(canonical_device(d) for d in devices)
    if torch.cuda.is_available():
        first = torch.cuda.current_device()
        if first + num_devices > torch.cuda.device_count():
            raise ValueError(f"num_devices={num_devices} from cuda:{first} but only "
                             f"{torch.cuda.device_count()} CUDA devices")
        return tuple(torch.device("cuda", first + i) for i in range(num_devices))
    return (torch.device("cpu"),) * num_devices


def resolve_device(devices: Sequence[str]) -> torch.device:
    """The stage's first device (see resolve_devices)."""
    return resolve_devices(devices)[0]


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`StageDeployConfig.dtype` as a torch dtype: "auto" is bfloat16 on an accelerator and
    float32 on CPU."""
    if dtype == "auto":
        return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {['auto', *_DTYPES]}, got {dtype!r}")
    return _DTYPES[dtype]


@contextlib.contextmanager
def device_scope(device: str | torch.device) -> Iterator[None]:
    """Make `device` the current CUDA device for the block and restore the previous one after
    (a no-op off CUDA), so kernels, streams, graphs and bare-"cuda" tensors land on it."""
    device = torch.device(device)
    if device.type != "cuda":
        yield
        return
    with torch.cuda.device(canonical_device(device)):
        yield
