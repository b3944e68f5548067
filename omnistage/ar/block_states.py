"""Per-block side storage: the hidden states and input embeddings of a cached block's tokens.

A request that hands hidden states to a downstream stage (an omni thinker feeding its
talker) needs a row for every prompt position, also for the positions a prefix-cache hit
skips. Those rows are stored beside the KV cache, slot for slot: one pool per kind of
`[num_slots, hidden]`, token p of a sequence at `block_table[p // block_size] * block_size +
p % block_size`, exactly where its keys are. A block's rows live and die with the block:
the block manager says which cached blocks hold which kinds (`Block.states`) and forgets
that when it evicts or hands out the block, after which its slots are simply overwritten.

NOTE: stored, not recomputed. A hidden state of the last layer (or of the talker's layer)
at a cached position needs every layer below it at that position, so recomputing it costs
the prefill the cache saved. Storing costs `hidden` values per kind per token slot, against
the KV cache's `2 x layers x kv_heads x head_dim` (Qwen2.5-Omni-7B's thinker: 3584 against
28672, so two kinds add 25%), and only on a stage whose requests asked for states (the pools
are made on the first write and grow, like the KV pools, with the largest block in use).
"""

from __future__ import annotations

import torch

from omnistage.ar.staging import to_device


class BlockStates:
    """One kind of per-position rows (hidden states or input embeddings) for every KV slot."""

    def __init__(self, block_size: int, max_num_blocks: int) -> None:
        self.block_size = block_size
        self.max_slots = max_num_blocks * block_size
        self.pool: torch.Tensor | None = None  # [num_slots, width], made on the first write

    def slots(self, block_table: list[int], start: int, end: int) -> list[int]:
        """The slots of positions [start, end) of a sequence with `block_table`."""
        size = self.block_size
        return [block_table[p // size] * size + p % size for p in range(start, end)]

    def write(self, slots: list[int], rows: torch.Tensor) -> None:
        need = max(slots) + 1
        if self.pool is None:
            self.pool = rows.new_zeros(min(max(need, 2 * self.block_size), self.max_slots), rows.shape[-1])
        elif need > self.pool.shape[0]:  # doubling, as the KV pools grow
            grown = self.pool.new_zeros(min(max(need, 2 * self.pool.shape[0]), self.max_slots), self.pool.shape[1])
            grown[:self.pool.shape[0]] = self.pool
            self.pool = grown
        [index] = to_device([slots], self.pool.device)
        self.pool.index_copy_(0, index, rows.to(self.pool.dtype))

    def read(self, slots: list[int]) -> torch.Tensor:
        if self.pool is None or max(slots) >= self.pool.shape[0]:
            raise RuntimeError("block states read before they were written: a cached block claims states "
                               "it does not hold")
        [index] = to_device([slots], self.pool.device)
        return self.pool.index_select(0, index)

    @property
    def num_bytes(self) -> int:
        return 0 if self.pool is None else self.pool.numel() * self.pool.element_size()
