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

With `in_place` (paged_attention.py: a kernel reads the blocks where they are) the key pool
holds each block transposed, `[num_blocks, kv_heads, head_dim, block_size]`, the layout the
kernel's score loop wants, and `update()` returns the pools themselves whenever the forward
reads cached keys (`begin(..., in_place=True)`), so nothing is gathered.

(A streamed decoder's sliding-window cache, one stream per row, is generation/window_cache.py.)
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from omnistage.ar.paged_attention import kernel_for

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
        self.in_place = False  # this forward's attention reads the pools (a PagedLayout mask)


class PagedLayer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False

    def __init__(self, view: _PagedView, transposed_keys: bool) -> None:
        super().__init__()
        self.view = view
        self.transposed_keys = transposed_keys

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        blocks, size = self.view.num_blocks, self.view.block_size
        h, d = key_states.shape[1], key_states.shape[-1]
        self.keys = key_states.new_zeros(*((blocks, h, d, size) if self.transposed_keys else (blocks * size, h, d)))
        self.values = value_states.new_zeros(blocks * size, value_states.shape[1], value_states.shape[-1])
        self.is_initialized = True

    def _grow(self, num_blocks: int) -> None:
        for name in ("keys", "values"):
            old = getattr(self, name)
            rows = num_blocks if name == "keys" and self.transposed_keys else num_blocks * self.view.block_size
            new = old.new_zeros(rows, *old.shape[1:])
            new[:old.shape[0]] = old
            setattr(self, name, new)

    @property
    def num_blocks(self) -> int:
        return self.keys.shape[0] if self.transposed_keys else self.keys.shape[0] // self.view.block_size

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        v = self.view
        if self.num_blocks < v.num_blocks:
            self._grow(v.num_blocks)
        b, h, t, d = key_states.shape
        # NOTE: index_copy_ / index_select on flat slot ids: several times faster on CPU than
        # advanced-index assignment and gathering, which is most of a tiny model's decode step.
        new_keys = key_states.transpose(1, 2).reshape(b * t, h, d)
        if self.transposed_keys:
            kernel_for(self.keys.device).write_keys(self.keys, new_keys, v.write_slots)
        else:
            self.keys.index_copy_(0, v.write_slots, new_keys)
        self.values.index_copy_(0, v.write_slots, value_states.transpose(1, 2).reshape(b * t, h, -1))
        if v.in_place:
            return self.keys, self.values
        if v.read_blocks is None:
            return key_states, value_states
        if self.transposed_keys:
            raise ValueError("an in-place cache's transposed key blocks cannot be gathered")
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

    def __init__(self, num_layers: int, block_size: int, max_num_blocks: int, in_place: bool = False) -> None:
        self.view = _PagedView(block_size)
        self.max_num_blocks = max_num_blocks  # the block manager's blocks + the scratch block
        self.in_place = in_place
        super().__init__(layers=[PagedLayer(self.view, transposed_keys=in_place) for _ in range(num_layers)])

    def begin(self, num_blocks: int, write_slots: torch.Tensor, read_blocks: torch.Tensor | None,
              kv_len: int, in_place: bool = False) -> None:
        """The next forward: storage for blocks 0..num_blocks-1, where its tokens go, which blocks
        each row reads, and how many of their keys it attends to (`kv_len`); or, `in_place`, that
        its attention reads the pools themselves (a `PagedLayout` says which blocks)."""
        v = self.view
        if num_blocks > v.num_blocks:
            v.num_blocks = min(max(num_blocks, 2 * v.num_blocks), self.max_num_blocks)
        if in_place and not self.in_place:
            raise ValueError("this cache was not built for in-place reads (PagedKVCache(in_place=True))")
        v.write_slots, v.read_blocks, v.kv_len, v.in_place = write_slots, read_blocks, kv_len, in_place

    @property
    def num_slots(self) -> int:
        return self.view.num_blocks * self.view.block_size

    @property
    def num_bytes(self) -> int:
        """Bytes the pools hold now (they grow as blocks are used)."""
        return sum(t.numel() * t.element_size() for layer in self.layers if layer.is_initialized
                   for t in (layer.keys, layer.values))
