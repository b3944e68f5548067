"""Which KV-cache blocks each sequence owns: reference counts, block tables, prefix caching.

Plain Python (no torch), like the scheduler that drives it. The KV cache
(`kv_cache.PagedKVCache`) is a pool of `num_blocks` blocks of `block_size` token slots;
a sequence's `block_table` lists the blocks holding its tokens in order, so token p
lives in slot `block_table[p // block_size] * block_size + p % block_size`.

Block 0 is never handed out: it is the scratch block that padding positions write into
(vLLM's null block), so ids run 1..num_blocks.

Prefix caching: a full block is keyed by its token ids, the digests of the media items
its positions overlap (media_spans.py: placeholder ids alone do not say which image they
stand for) and the key of the block before it, so equal keys mean equal prefixes. The
first block's "block before" is the sequence's LoRA adapter and scale (`Sequence.lora`, None
without one): the same prompt under another adapter has other keys and values. A new
sequence takes every cached block its prompt starts with (one more reference each) and
computes only the rest. A block whose last reference goes away stays cached in the free
queue until it is handed out again: the queue is LRU, and a freed sequence's blocks enter
it tail first, so the end of a prompt is evicted before its (more shared) beginning.
A prompt fed as embeddings (a talker's) is keyed by the digests of its rows the same way
(media_spans.row_spans); its generated tokens' blocks are not published (`Sequence.cache_outputs`).
Blocks holding nothing reusable (never filled, or filled while an equal block was already
cached) go to the front.

A request that returns hidden states / input embeddings (an omni thinker feeding its talker)
needs those rows for the cached positions too: a block published by such a request says
which it holds (`Block.states`; the rows are in the runner's block_states.py pools), and
such a request reuses only blocks that hold all it returns. A block published without
them is replaced in the cache by an equal one computed with them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from omnistage.ar.media_spans import block_digests

if TYPE_CHECKING:
    from omnistage.ar.sequence import Sequence

BlockKey = tuple  # (key hash of the block before (block 0: the LoRA adapter), token ids[, media digests])


class Block:
    __slots__ = ("block_id", "ref_count", "key", "states")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.key: BlockKey | None = None  # set while the block is in the prefix cache
        self.states: frozenset[str] = frozenset()
        """Per-position rows its slots hold in the side storage (`Sequence.state_kinds`), while cached."""

    def uncache(self) -> None:
        self.key = None
        self.states = frozenset()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks + 1)]  # blocks[0]: scratch
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, num_blocks + 1))
        self.cached: dict[BlockKey, int] = {}
        self.max_block_id = 0
        """Largest id ever handed out: the cache only needs physical storage up to it."""
        # metrics
        self.num_prefix_queries = 0
        self.num_prefix_hits = 0  # tokens

    # --- sizes ---------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- prefix cache --------------------------------------------------------------------

    def match_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks `seq`'s tokens start with (no side effect). At least one token is
        left to compute: its forward gives the logits of the next token."""
        if not (self.enable_prefix_caching and seq.prefix_cacheable):
            return []
        tokens = seq.all_token_ids
        hits: list[int] = []
        parent = None
        for i in range((len(tokens) - 1) // self.block_size):
            key = self._key(seq, tokens, i, parent)
            block_id = self.cached.get(key)
            if block_id is None or not seq.state_kinds <= self.blocks[block_id].states:
                break
            hits.append(block_id)
            parent = hash(key)
        return hits

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Key every block of `seq` that is now full of computed tokens (after its forward)."""
        if not (self.enable_prefix_caching and seq.prefix_cacheable):
            return
        computed = seq.num_computed_tokens if seq.cache_outputs else min(seq.num_computed_tokens,
                                                                          seq.num_prompt_tokens)
        num_full = computed // self.block_size
        if len(seq.block_keys) >= num_full:
            return
        tokens = seq.all_token_ids
        for i in range(len(seq.block_keys), num_full):
            parent = hash(seq.block_keys[-1]) if seq.block_keys else None
            key = self._key(seq, tokens, i, parent)
            seq.block_keys.append(key)
            block = self.blocks[seq.block_table[i]]
            if block.key is not None:
                continue  # a cache hit: published already
            held = self.cached.get(key)
            if held is not None:
                old = self.blocks[held]
                if not seq.state_kinds > old.states:
                    continue
                self._forget(old)  # this copy also holds the rows the cached one lacks
            block.key, block.states = key, seq.state_kinds
            self.cached[key] = block.block_id

    def _key(self, seq: Sequence, tokens: list[int], i: int, parent: int | None) -> BlockKey:
        start, end = i * self.block_size, (i + 1) * self.block_size
        digests = block_digests(seq.media_spans, start, end)
        before = parent if i else seq.lora  # a tuple, never equal to a hash
        return (before, tuple(tokens[start:end])) + ((digests,) if digests else ())

    # --- allocation -------------------------------------------------------------------------

    def can_allocate(self, seq: Sequence, hits: list[int], num_tokens: int) -> bool:
        """Can a waiting `seq` start with the cached blocks `hits` and room for `num_tokens` tokens?"""
        reclaimed = sum(1 for b in hits if self.blocks[b].ref_count == 0)  # hits sitting in the free queue
        return self.blocks_for(num_tokens) - len(hits) <= self.num_free_blocks - reclaimed

    def allocate(self, seq: Sequence, hits: list[int], num_tokens: int) -> None:
        """Give a waiting `seq` the blocks `hits` (already computed) plus new ones up to `num_tokens` tokens."""
        assert not seq.block_table, f"{seq.request_id} already holds blocks"
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_keys.append(block.key)
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        self.num_prefix_queries += seq.num_tokens
        self.num_prefix_hits += seq.num_cached_tokens
        self._grow(seq, num_tokens)

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        """Can running `seq` hold `num_tokens` tokens in all?"""
        return self.blocks_for(num_tokens) - len(seq.block_table) <= self.num_free_blocks

    def append(self, seq: Sequence, num_tokens: int) -> None:
        self._grow(seq, num_tokens)

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references; its cached blocks stay reusable until evicted."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block_id] = None
                if block.key is None:
                    self.free_queue.move_to_end(block_id, last=False)  # nothing to reuse: hand it out first
        seq.block_table = []
        seq.block_keys = []
        seq.num_computed_tokens = 0

    def _grow(self, seq: Sequence, num_tokens: int) -> None:
        need = self.blocks_for(num_tokens) - len(seq.block_table)
        if need > self.num_free_blocks:
            raise RuntimeError(f"{seq.request_id}: {need} blocks needed, {self.num_free_blocks} free")
        for _ in range(need):
            block_id, _ = self.free_queue.popitem(last=False)  # least recently used
            block = self.blocks[block_id]
            block.ref_count = 1
            if block.key is not None:  # evict it from the prefix cache
                self._forget(block)
            seq.block_table.append(block_id)
            self.max_block_id = max(self.max_block_id, block_id)

    def reset_prefix_cache(self) -> None:
        """Forget every unreferenced cached block (tests and benchmarks measure cold starts)."""
        for block_id in list(self.free_queue):
            block = self.blocks[block_id]
            if block.key is not None:
                self._forget(block)

    def _forget(self, block: Block) -> None:
        """Take `block` out of the prefix cache (its KV and side rows stay until it is handed out)."""
        del self.cached[block.key]
        block.uncache()
        if block.ref_count == 0:
            self.free_queue.move_to_end(block.block_id, last=False)  # nothing to reuse: hand it out first
