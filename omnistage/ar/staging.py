"""A step's small inputs (block tables, positions, token ids, sampling parameters) cross to the
device in one copy: every list goes into one host tensor, pinned on CUDA so the copy is
asynchronous, then split into views on the device. Built tensor by tensor from Python lists,
each would be its own blocking copy from pageable memory, several per step."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import torch


def to_device(rows: Sequence[Sequence[int | float]], device: torch.device | str,
              dtype: torch.dtype = torch.long) -> list[torch.Tensor]:
    """Each list of `rows` as a 1-D `dtype` tensor on `device`, all from one host-to-device copy.
    (Pinned blocks come from torch's caching host allocator, which keeps one alive until its copy
    has finished.)"""
    host = torch.tensor(list(chain.from_iterable(rows)), dtype=dtype)
    if torch.device(device).type == "cuda":
        host = host.pin_memory().to(device, non_blocking=True)
    return list(host.split([len(row) for row in rows]))
