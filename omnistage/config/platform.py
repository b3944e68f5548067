"""Which platform this process runs on, for picking a deploy file's `platforms:` overlay.

Importing torch takes seconds, so `omnistage config show` on a laptop should not pay for
it just to learn there is no GPU. The cheap signals come first: a process that already
imported torch asks torch; a Linux machine without the NVIDIA or ROCm driver is a CPU
machine. Only when a driver is present does torch decide (it honours
CUDA_VISIBLE_DEVICES, which a driver check cannot).
"""

from __future__ import annotations

import os
import shutil
import sys

PLATFORMS = ("cpu", "cuda", "rocm", "mps", "xpu")
"""Names a deploy file may use under `platforms:`."""


def detect_platform() -> str:
    """One of PLATFORMS for this process."""
    if "torch" not in sys.modules and not _may_have_accelerator():
        return "cpu"
    try:
        import torch
    except ImportError:
        return "cpu"
    return _torch_platform(torch)


def _may_have_accelerator() -> bool:
    if sys.platform == "darwin":
        return True  # Apple silicon: only torch knows whether MPS works
    return (
        os.path.exists("/proc/driver/nvidia/version")
        or shutil.which("nvidia-smi") is not None
        or os.path.exists("/dev/kfd")  # ROCm
        or os.path.exists("/dev/dri/renderD128") and shutil.which("xpu-smi") is not None
    )


def _torch_platform(torch) -> str:
    if torch.cuda.is_available():
        # ROCm builds of torch drive AMD GPUs through the torch.cuda API.
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"
