"""Device and dtype for a stage engine, from its `StageDeployConfig` (shared by every engine kind)."""

from __future__ import annotations

import torch

from omnistage.config.deploy_fields import StageDeployConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(config: StageDeployConfig) -> torch.device:
    """The stage's first device; with none given, cuda:0 when CUDA is available, else cpu."""
    if config.devices:
        return torch.device(config.devices[0])
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def resolve_dtype(config: StageDeployConfig, device: torch.device) -> torch.dtype:
    """"auto" is bfloat16 on an accelerator and float32 on CPU."""
    if config.dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if config.dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {['auto', *_DTYPES]}, got {config.dtype!r}")
    return _DTYPES[config.dtype]
