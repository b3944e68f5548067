"""Attention that reads the paged KV cache in place, and how a stage picks it.

The other way (`paged_attention: gather`, kv_cache.py + packed_attention.py) copies each
row's blocks into one contiguous tensor per layer, then runs SDPA: three passes over the
keys (gather read, gather write, attention read). vLLM's paged kernels read the blocks in
place, in one pass, with an online softmax over the blocks. On CPU ours is a small C++
extension (kernels/paged_attention.cpp), compiled on first use with torch's
`cpp_extension.load` into the user's cache dir (a compiler and ninja are all it needs, and it
is built for the processor it runs on; scripts/setup_env.sh builds it once at install so a
first request does not wait for the compiler).

A step runs through the kernel as vLLM's flattened batch: every row's tokens end to end
(`[1, N]`), the layers' attention mask replaced by a `PagedLayout` (each row's block table,
where its tokens start, how many keys it has), and the cache's `update()` returning the
pools themselves rather than a gathered copy (`_PagedView.in_place`). `packed_sdpa` hands a
`PagedLayout` to `attend_in_place`.

CUDA: a Triton kernel with the CPU kernel's ops, arguments and pool layouts
(kernels/paged_attention_triton.py; Triton compiles it at its first launch), chosen with "kernel"
(which refuses to start, saying why, where triton does not import). "auto" keeps the gather path
on CUDA until the kernel has passed on a GPU: a default should be a tested path. Triton rather than
FlashInfer's or flash-attn's block-table interfaces: triton comes with CUDA torch, where those
must be built for the machine's torch and CUDA. Its launches need no host sync, so the static
decode of `compile: true` (cuda_graphs.py) captures it in CUDA graphs. It is checked on CPU
tensors through Triton's interpreter (fp32) and compiled ahead of time for sm_90 (no GPU needed;
tests/ar/test_paged_attention.py); on a GPU (bf16, the engine, CUDA graphs: tests/gpu/
test_paged_attention_cuda.py) it has not run yet.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

SETTINGS = ("auto", "kernel", "gather")
SOURCE = Path(__file__).parent / "kernels" / "paged_attention.cpp"


@dataclass
class PagedLayout:
    """Which keys each row of a flattened step attends to (see module docstring)."""

    block_tables: torch.Tensor
    """[R, W] int32: each row's blocks in position order (past its blocks: the scratch block 0)."""
    query_starts: torch.Tensor
    """[R + 1] int32: row r's tokens are N-positions query_starts[r]..query_starts[r + 1] - 1."""
    context_lens: torch.Tensor
    """[R] int32: keys of row r after this forward; its tokens are the last of them (causal)."""


_PLAIN_KWARGS = {"dropout", "scaling", "sliding_window", "position_ids", "use_cache", "output_hidden_states",
                 "output_attentions"}
"""What Qwen2-style layers hand the attention function; the kernel knows nothing more (a position
bias, sinks, a softcap, a window)."""


def attend_in_place(module, query: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor,
                    layout: PagedLayout, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [1, H, N, D], the pools [slots, H_kv, D]
    (what `PagedLayer.update` returns in place) -> ([1, N, H, Dv], None)."""
    unknown = sorted(k for k, v in kwargs.items() if k not in _PLAIN_KWARGS and v is not None)
    if unknown or kwargs.get("sliding_window") or kwargs.get("dropout", 0.0):
        raise ValueError(f"paged_attention: the in-place kernel takes plain causal attention, but this layer also "
                         f"passes {unknown or ['sliding_window/dropout']}; set paged_attention: gather")
    scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
    out = kernel_for(query.device).paged_attention(query[0].transpose(0, 1), key_pool, value_pool,
                                                   layout.block_tables, layout.query_starts, layout.context_lens,
                                                   scale)
    return out[None], None


def uses_kernel(setting: str, device: torch.device, model_supports: bool) -> bool:
    """The `paged_attention` deploy setting -> read the blocks in place? "auto": where a kernel runs
    on `device` and the model's layers are plain causal attention (on CPU; CUDA gathers until its
    kernel has run on a GPU); "kernel": required (else the
    stage refuses to start, saying why); "gather": never."""
    if setting not in SETTINGS:
        raise ValueError(f"paged_attention must be one of {list(SETTINGS)}, got {setting!r}")
    if setting == "gather":
        return False
    if setting == "auto" and torch.device(device).type == "cuda":
        return False  # the Triton kernel has not run on a GPU yet: opt in with "kernel"
    why_not = None if model_supports else "this model's attention is not plain causal (or it has its own forward)"
    if why_not is None:
        try:
            kernel_for(torch.device(device))
        except RuntimeError as e:
            why_not = str(e)
    if why_not is not None and setting == "kernel":
        raise ValueError(f"paged_attention: kernel: {why_not}")
    return why_not is None


def kernel_for(device: torch.device) -> Any:
    """The ops (`paged_attention`, `write_keys`) for `device`; RuntimeError when there are none."""
    if device.type == "cuda":
        module, error = _load_triton_kernel()
        if module is None:
            raise RuntimeError(f"the CUDA kernel needs triton, which does not import ({error})")
        return module
    if device.type != "cpu":
        raise RuntimeError(f"no in-place paged attention kernel for {device.type}")
    module, error = _load_cpu_kernel()
    if module is None:
        raise RuntimeError(f"the CPU kernel did not build ({error})")
    return module


@functools.cache
def _load_triton_kernel() -> tuple[Any, str | None]:
    """Import kernels/paged_attention_triton.py (triton compiles it for the GPU at its first launch)."""
    try:
        from omnistage.ar.kernels import paged_attention_triton
    except ImportError as e:
        logger.warning("paged attention: triton does not import (%s); AR stages on CUDA gather each sequence's "
                       "KV blocks before SDPA instead", e)
        return None, f"{type(e).__name__}: {e}"
    return paged_attention_triton, None


@functools.cache
def _load_cpu_kernel() -> tuple[Any, str | None]:
    """Compile (or load the cached build of) kernels/paged_attention.cpp; logs the outcome once."""
    build_dir = kernel_cache_dir()
    try:
        if shutil.which("ninja") is None:  # the `ninja` wheel's binary, when no system one is on PATH
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        build_dir.mkdir(parents=True, exist_ok=True)
        # a plain library that registers torch.ops.omnistage_paged (no pybind11: compiles in a third of the time)
        name = f"omnistage_{build_dir.name}"
        built = build_dir / f"{name}.so"
        # the directory's name covers the source, torch and the CPU: never stale; torch holds a "lock"
        # file there while another process builds it
        if built.exists() and not (build_dir / "lock").exists():
            torch.ops.load_library(str(built))
        else:
            from torch.utils import cpp_extension  # imports setuptools: only when it compiles

            cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=["-O3", "-march=native", "-fopenmp"],
                               extra_ldflags=["-fopenmp"], build_directory=str(build_dir), is_python_module=False,
                               verbose=False)
        module = torch.ops.omnistage_paged
    except Exception as e:  # a compiler or header missing: the gather path still runs everywhere
        lines = str(e).strip().splitlines() or [""]
        error = f"{type(e).__name__}: {next((s for s in lines if 'error' in s), lines[-1]).strip()}"
        logger.warning("paged attention: the CPU kernel did not build (%s); AR stages gather each sequence's "
                       "KV blocks before SDPA instead", error)
        return None, error
    logger.info("paged attention: AR stages on CPU read the KV blocks in place (kernel in %s)", build_dir)
    return module, None


def kernel_cache_dir() -> Path:
    """Where the build goes: per source, torch version and processor (it is compiled with
    -march=native, so a cache dir shared between machines keeps one build per CPU)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = hashlib.sha256(SOURCE.read_bytes())
    key.update(torch.__version__.encode())
    key.update((platform.machine() + _cpu_flags()).encode())
    return Path(base) / "omnistage" / "kernels" / f"paged_attention_{key.hexdigest()[:12]}"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()
