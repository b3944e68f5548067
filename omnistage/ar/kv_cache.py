"""A slot KV cache that transformers models write into through the public `Cache` API.

Each layer holds preallocated `[max_num_seqs, kv_heads, capacity, head_dim]` keys and
values. Slot i is one running sequence's row. The runner tells the cache what the next
forward is (`begin_prefill` / `begin_decode`); `update()`, called by every attention
layer, then writes the new keys and values into the right slots and returns what the
layer attends to:

- prefill: the new rows are written to slots `first..first+n-1`, positions `0..T-1`, and
  the layer attends to the fresh keys only (no prefix cache);
- decode: one key per slot is written at that slot's position, and the layer attends to
  the slice `[:n, :, :kv_len]`, with padding hidden by the runner's attention mask;
- extend: T keys per row are written at any slots and positions (a chunk continuing a
  stream, as in a streaming codec decoder), and the layer attends to those slots'
  first `kv_len` positions (gathered).

The capacity grows (doubling, up to max_model_len) as sequences get longer, so short
workloads do not pay for max_model_len up front.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

_MIN_CAPACITY = 128


class _BatchView:
    """What the current forward reads and writes; shared by every layer."""

    def __init__(self, max_num_seqs: int, max_model_len: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.capacity = min(_MIN_CAPACITY, max_model_len)
        self.is_prefill = True
        self.first_slot = 0
        self.num_rows = 0
        self.kv_len = 0
        self.is_extend = False
        self.rows: torch.Tensor | None = None  # decode: arange(num_rows); extend: [num_rows, T] slot per key
        self.slots: torch.Tensor | None = None  # extend: [num_rows] slot per row
        self.positions: torch.Tensor | None = None  # decode: [num_rows]; extend: [num_rows, T] write positions


class SlotLayer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False

    def __init__(self, view: _BatchView) -> None:
        super().__init__()
        self.view = view

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        v = self.view
        self.device, self.dtype = key_states.device, key_states.dtype
        num_heads = key_states.shape[1]
        self.keys = torch.zeros(v.max_num_seqs, num_heads, v.capacity, key_states.shape[-1],
                                dtype=key_states.dtype, device=key_states.device)
        self.values = torch.zeros(v.max_num_seqs, num_heads, v.capacity, value_states.shape[-1],
                                  dtype=value_states.dtype, device=value_states.device)
        self.is_initialized = True

    def _grow(self, capacity: int) -> None:
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(old.shape[0], old.shape[1], capacity, old.shape[3])
            new[:, :, :old.shape[2]] = old
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        v = self.view
        if self.keys.shape[2] < v.capacity:
            self._grow(v.capacity)
        if v.is_prefill:
            t = key_states.shape[2]
            rows = slice(v.first_slot, v.first_slot + key_states.shape[0])
            self.keys[rows, :, :t] = key_states
            self.values[rows, :, :t] = value_states
            return key_states, value_states
        if v.is_extend:
            self.keys[v.rows, :, v.positions] = key_states.transpose(1, 2)
            self.values[v.rows, :, v.positions] = value_states.transpose(1, 2)
            return (self.keys.index_select(0, v.slots)[:, :, :v.kv_len],
                    self.values.index_select(0, v.slots)[:, :, :v.kv_len])
        self.keys[v.rows, :, v.positions] = key_states[:, :, 0]
        self.values[v.rows, :, v.positions] = value_states[:, :, 0]
        return self.keys[:v.num_rows, :, :v.kv_len], self.values[:v.num_rows, :, :v.kv_len]

    def move(self, src: int, dst: int) -> None:
        if self.is_initialized:
            self.keys[dst] = self.keys[src]
            self.values[dst] = self.values[src]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.view.kv_len, 0

    def get_seq_length(self) -> int:
        return self.view.kv_len

    def get_max_length(self) -> int:
        return self.view.max_model_len


class SlotKVCache(Cache):
    """A transformers `Cache` whose rows are the scheduler's slots (see module docstring)."""

    def __init__(self, num_layers: int, max_num_seqs: int, max_model_len: int, device: torch.device | str) -> None:
        self.view = _BatchView(max_num_seqs, max_model_len)
        super().__init__(layers=[SlotLayer(self.view) for _ in range(num_layers)])
        self._rows = torch.arange(max_num_seqs, device=device)

    def _ensure_capacity(self, length: int) -> None:
        v = self.view
        if length > v.capacity:
            v.capacity = min(v.max_model_len, max(length, 2 * v.capacity))

    def begin_prefill(self, first_slot: int, num_rows: int, length: int) -> None:
        v = self.view
        self._ensure_capacity(length)
        v.is_prefill, v.is_extend, v.first_slot, v.num_rows, v.kv_len = True, False, first_slot, num_rows, length

    def begin_decode(self, positions: torch.Tensor, kv_len: int) -> None:
        """`positions[i]` is where slot i's new key goes; the layers attend to `kv_len` positions."""
        v = self.view
        self._ensure_capacity(kv_len)
        n = positions.shape[0]
        v.is_prefill, v.is_extend, v.first_slot, v.num_rows, v.kv_len = False, False, 0, n, kv_len
        v.rows, v.positions = self._rows[:n], positions

    def begin_extend(self, slots: torch.Tensor, positions: torch.Tensor, kv_len: int) -> None:
        """Row i writes its keys into slot `slots[i]` at `positions[i]` ([B, T]) and attends to that
        slot's first `kv_len` positions (the caller's mask hides what each row must not see)."""
        v = self.view
        self._ensure_capacity(kv_len)
        v.is_prefill, v.is_extend, v.num_rows, v.kv_len = False, True, slots.shape[0], kv_len
        v.slots, v.positions = slots, positions
        v.rows = slots[:, None].expand_as(positions)

    def move(self, src: int, dst: int) -> None:
        """Copy slot `src` into slot `dst` (the scheduler repacking running sequences into the lowest slots)."""
        for layer in self.layers:
            layer.move(src, dst)

    @property
    def capacity(self) -> int:
        return self.view.capacity
