"""Parked weights: a sleeping stage's tensors moved off its accelerator, put back on wake.

`Parked(modules)` moves every parameter and buffer of `modules` that sits on an
accelerator to host memory; `restore()` puts each one back on the device it came from.
Tensors move in place (`tensor.data = ...`), so modules, hooks and tied weights keep
pointing at the same tensor objects, and what already lived on the host (a CPU stage,
layers that `offload` keeps on the host) stays where it is. CUDA graphs captured on the
old addresses are not valid after a round trip: engines that hold some refuse to sleep.

`return_freed_memory()` ends every sleep: what the stage freed on the host goes back to
the operating system, not only to the process's allocator.
"""

from __future__ import annotations

import ctypes
import functools
import gc
from itertools import chain
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# torch is imported where it is used: AsyncOmni imports this module (check_can_sleep), and
# `import omnistage` stays free of torch.


def torch_modules(owner: Any) -> list[torch.nn.Module]:
    """The torch modules among `owner`'s attributes (or a dict's values), one level deep."""
    import torch

    values = owner.values() if isinstance(owner, dict) else vars(owner).values()
    return [value for value in values if isinstance(value, torch.nn.Module)]


class Parked:
    def __init__(self, modules: list[torch.nn.Module]):
        import torch

        self._places: list[tuple[torch.Tensor, torch.device]] = []
        seen: set[int] = set()
        for module in modules:
            for tensor in chain(module.parameters(), module.buffers()):
                if id(tensor) in seen or tensor.device.type in ("cpu", "meta"):
                    continue
                seen.add(id(tensor))
                self._places.append((tensor, tensor.device))
                tensor.data = tensor.data.to("cpu")
        self.num_bytes = sum(t.numel() * t.element_size() for t, _ in self._places)
        """Bytes moved off the accelerator (0 on a CPU stage)."""
        if self._places and torch.cuda.is_available():
            torch.cuda.empty_cache()  # hand the freed blocks back to the driver, not just to torch's pool

    def restore(self) -> None:
        for tensor, device in self._places:
            tensor.data = tensor.data.to(device)
        self._places.clear()


def return_freed_memory() -> None:
    """Free what only cycles still hold, then ask glibc to hand its free heap pages back to the
    OS (`malloc_trim(0)`, every arena). Without it a sleeping CPU stage keeps its dropped weights
    in its resident memory: glibc serves large tensors from the heap once freed mmap chunks have
    raised its mmap threshold, and keeps freed heap memory for reuse. A no-op where the C library
    has no `malloc_trim` (musl, macOS, Windows)."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's `malloc_trim` among the symbols the process has loaded, or None."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):  # no such symbol; TypeError: Windows' CDLL needs a name
        return None


SLEEP_LEVELS = (1, 2)
"""1: weights off the accelerator, caches freed. 2: also the weights' storage freed (those the
stage's checkpoint holds; wake-up reads them back from it: core/weights.py)."""


def check_can_sleep(level: int, num_running: int) -> None:
    """What every engine's `sleep(level)` checks first: a known level, and nothing running."""
    if level not in SLEEP_LEVELS:
        levels = ", ".join(map(str, SLEEP_LEVELS))
        raise ValueError(f"level: {level!r} is not a sleep level ({levels})")
    if num_running:
        raise RuntimeError(f"sleep: {num_running} request(s) are still running")


def check_can_update(num_running: int, is_dropped: bool) -> None:
    """What every engine's `update_weights` checks first: nothing running (no request may see a mix
    of old and new weights), and weights there to update."""
    if num_running:
        raise RuntimeError(f"update_weights: {num_running} request(s) are still running")
    if is_dropped:
        raise RuntimeError("update_weights: the stage sleeps at level 2 (its weights are dropped); wake it up first")
