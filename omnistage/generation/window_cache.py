"""A sliding-window attention's keys and values per stream, for decoders that stream (generation/).

A streamed decoder's transformer (Mimi's, code2wav's) attends causally to a window of
`window` positions, so a stream only ever needs the keys and values of its last
`window - 1` positions. Each stream keeps those in a `WindowKV`; a pass over several
streams' chunks gathers them into a `WindowCache` (the transformers `Cache` the model's
layers write into), left-padded to a common length, attends through `mask()`, and
`commit()` keeps each stream's last `window - 1` real positions again. A chunk's attention
so costs its own frames plus at most a window, wherever it is in the stream.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class WindowKV:
    """One stream's keys and values: per layer [heads, <= window - 1, head_dim] (None before its first pass)."""

    def __init__(self, num_layers: int) -> None:
        self.num_positions = 0  # positions decoded so far: the next one's absolute position
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def clear(self) -> None:
        self.keys = [None] * len(self.keys)
        self.values = [None] * len(self.values)

    def __len__(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[1]


class _PassLayer(CacheLayerMixin):
    """One layer in one pass: the rows' cached keys (left-padded) followed by the pass's new ones."""

    is_compileable = False
    is_sliding = True

    def __init__(self) -> None:
        super().__init__()
        self.past: tuple[torch.Tensor, torch.Tensor] | None = None
        self.seen: tuple[torch.Tensor, torch.Tensor] | None = None  # what the pass attended to

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.past is not None:
            key_states = torch.cat([self.past[0], key_states], dim=2)
            value_states = torch.cat([self.past[1], value_states], dim=2)
        self.seen = (key_states, value_states)
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length + self.get_seq_length(), 0

    def get_seq_length(self) -> int:
        return 0 if self.past is None else self.past[0].shape[2]

    def get_max_length(self) -> int:
        return -1


class WindowCache(Cache):
    """The keys and values of one pass over the rows `streams` (one `WindowKV` per row)."""

    def __init__(self, streams: list[WindowKV], window: int) -> None:
        super().__init__(layers=[_PassLayer() for _ in streams[0].keys])
        self.streams, self.window = streams, window
        self.num_past = [len(s) for s in streams]
        self.past_len = max(self.num_past)
        if self.past_len:
            for i, layer in enumerate(self.layers):
                layer.past = (self._gather([s.keys[i] for s in streams]), self._gather([s.values[i] for s in streams]))

    def _gather(self, rows: list[torch.Tensor | None]) -> torch.Tensor:
        like = next(r for r in rows if r is not None)
        out = like.new_zeros(len(rows), like.shape[0], self.past_len, like.shape[2])
        for i, r in enumerate(rows):
            if r is not None:
                out[i, :, self.past_len - r.shape[1]:] = r
        return out

    def positions(self, num_new: int, device: torch.device) -> torch.Tensor:
        """[B, T] the new frames' absolute positions (rotary embeddings)."""
        start = torch.tensor([s.num_positions for s in self.streams], device=device)[:, None]
        return start + torch.arange(num_new, device=device)

    def mask(self, num_new: int, device: torch.device) -> torch.Tensor:
        """[B, 1, T, past + T] boolean: each query sees its stream's keys within the window, causally."""
        q = self.positions(num_new, device)
        k = q[:, :1] + torch.arange(-self.past_len, num_new, device=device)  # [B, past + T]
        real = torch.arange(-self.past_len, 0, device=device) >= -torch.tensor(self.num_past, device=device)[:, None]
        real = torch.cat([real, real.new_ones(len(self.streams), num_new)], dim=1)  # pads of the past are not keys
        mask = real[:, None] & (k[:, None] <= q[..., None]) & (k[:, None] > q[..., None] - self.window)
        return mask[:, None]

    def commit(self, lens: list[int]) -> None:
        """After the pass: each stream keeps its last window - 1 real keys and values, and moves on `lens[i]`."""
        keep = self.window - 1
        for i, layer in enumerate(self.layers):
            keys, values = layer.seen
            for row, (kv, n) in enumerate(zip(self.streams, lens)):
                hi = self.past_len + n
                lo = max(self.past_len - self.num_past[row], hi - keep)
                kv.keys[i] = keys[row, :, lo:hi].clone() if hi > lo else None
                kv.values[i] = values[row, :, lo:hi].clone() if hi > lo else None
        for kv, n in zip(self.streams, lens):
            kv.num_positions += n
