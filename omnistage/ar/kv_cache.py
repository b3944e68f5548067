"""KV caches that transformers models write into through the public `Cache` API.

`PagedKVCache` (the AR engine's): per layer one pool of `[num_slots, kv_heads,
head_dim]` keys and values, `num_slots = (num_blocks + 1) * block_size`, where the
`BlockManager` decides which blocks hold which sequence's tokens. Before each forward
the runner hands it, for the `[B, T]` batch, the slot each new token writes to
(`write_slots`, padding -> the scratch block 0) and, for each row, the blocks it attends
to in position order (`read_blocks`, flat, the same number per row). `update()`,
called by every attention layer, writes the new keys and values, then returns either the
fresh ones (a prefill with nothing cached before it: no gather) or the gathered
`[B, kv_heads, kv_len, head_dim]` rows, gathered as whole blocks (a block is one contiguous
copy: twice as fast on CPU as gathering its slots one by one) and cut to `kv_len`; the
runner's mask hides what each row must not see. The pools grow (doubling) up to the block manager's largest block id, so a small
workload does not pay for the whole budget up front.

`SlotKVCache` (the streaming codec decoder's, generation/mimi.py): each layer holds
preallocated `[max_num_seqs, kv_heads, capacity, head_dim]` keys and values, slot i
being one stream's row:

- prefill: the new rows are written to slots `first..first+n-1`, positions `0..T-1`, and
  the layer attends to the fresh keys only;
- decode: one key per slot is written at that slot's position, and the layer attends to
  the slice `[:n, :, :kv_len]`, with padding hidden by the runner's attention mask;
- extend: T keys per row are written at any slots and positions (a chunk continuing a
  stream), and the layer attends to those slots' first `kv_len` positions (gathered).

Its capacity grows (doubling, up to max_model_len) as sequences get longer.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

_MIN_CAPACITY = 128


def kv_dims(config) -> tuple[int, int]:
    """(kv heads, head dim) of a transformers text config: what one token's key takes per layer."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv_heads, head_dim


class _PagedView:
    """What the current forward writes and reads; shared by every layer."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.num_blocks = 1  # physical blocks the pools hold now (block 0 = scratch)
        self.write_slots: torch.Tensor | None = None  # [B * T]
        self.read_blocks: torch.Tensor | None = None  # [B * kv_len / block_size], or None: the fresh keys
        self.kv_len = 0


class PagedLayer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False

    def __init__(self, view: _PagedView) -> None:
        super().__init__()
        self.view = view

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        slots = self.view.num_blocks * self.view.block_size
        self.keys = key_states.new_zeros(slots, key_states.shape[1], key_states.shape[-1])
        self.values = value_states.new_zeros(slots, value_states.shape[1], value_states.shape[-1])
        self.is_initialized = True

    def _grow(self, slots: int) -> None:
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(slots, *old.shape[1:])
            new[:old.shape[0]] = old
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        v = self.view
        if self.keys.shape[0] < v.num_blocks * v.block_size:
            self._grow(v.num_blocks * v.block_size)
        b, h, t, d = key_states.shape
        # NOTE: index_copy_ / index_select on flat slot ids: several times faster on CPU than
        # advanced-index assignment and gathering, which is most of a tiny model's decode step.
        self.keys.index_copy_(0, v.write_slots, key_states.transpose(1, 2).reshape(b * t, h, d))
        self.values.index_copy_(0, v.write_slots, value_states.transpose(1, 2).reshape(b * t, h, -1))
        if v.read_blocks is None:
            return key_states, value_states
        size = v.block_size
        per_row = v.read_blocks.shape[0] // b * size  # whole blocks; a row attends to its first kv_len keys
        keys = self.keys.view(-1, size, h, d).index_select(0, v.read_blocks).view(b, per_row, h, d)
        values = self.values.view(-1, size, h, self.values.shape[-1]).index_select(0, v.read_blocks)
        keys, values = keys[:, :v.kv_len], values.view(b, per_row, h, -1)[:, :v.kv_len]
        return keys.transpose(1, 2), values.transpose(1, 2)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.view.kv_len, 0

    def get_seq_length(self) -> int:
        return self.view.kv_len

    def get_max_length(self) -> int:
        return -1


class PagedKVCache(Cache):
    """A transformers `Cache` over the block manager's blocks (see module docstring)."""

    def __init__(self, num_layers: int, block_size: int, max_num_blocks: int) -> None:
        self.view = _PagedView(block_size)
        self.max_num_blocks = max_num_blocks  # the block manager's blocks + the scratch block
        super().__init__(layers=[PagedLayer(self.view) for _ in range(num_layers)])

    def begin(self, num_blocks: int, write_slots: torch.Tensor, read_blocks: torch.Tensor | None,
              kv_len: int) -> None:
        """The next forward: storage for blocks 0..num_blocks-1, where its tokens go, which blocks
        each row reads, and how many of their keys it attends to (`kv_len`)."""
        v = self.view
        if num_blocks > v.num_blocks:
            v.num_blocks = min(max(num_blocks, 2 * v.num_blocks), self.max_num_blocks)
        v.write_slots, v.read_blocks, v.kv_len = write_slots, read_blocks, kv_len

    @property
    def num_slots(self) -> int:
        return self.view.num_blocks * self.view.block_size

    @property
    def num_bytes(self) -> int:
        """Bytes the pools hold now (they grow as blocks are used)."""
        return sum(t.numel() * t.element_size() for layer in self.layers if layer.is_initialized
                   for t in (layer.keys, layer.values))


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
