"""Device and dtype for a stage engine, from its deploy fields (shared by every engine kind)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(devices: Sequence[str]) -> torch.device:
    """The stage's first device (`StageDeployConfig.devices`); with none given, cuda:0 when
    CUDA is available, else cpu."""
    if devices:
        return torch.device(devices[0])
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`StageDeployConfig.dtype` as a torch dtype: "auto" is bfloat16 on an accelerator and
    float32 on CPU."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {['auto', *_DTYPES]}, got {dtype!r}")
    return _DTYPES[dtype]
