"""Attention that reads the AR engine's paged KV pools in place (CUDA, Triton): the CPU kernel's
ops (kernels/paged_attention.cpp) with the same arguments and pool layouts.

Rows are a step's sequences, their query tokens laid end to end (`query_starts`); row r has
`context_lens[r]` keys, the last `n_r` of them its own tokens, so its query j sits at position
context_lens[r] - n_r + j and attends to keys 0..that position (causal; a decode row is n_r = 1).
Pools hold blocks of BLOCK tokens, the row's blocks in position order in `block_tables[r]`:
  keys   [num_blocks, kv_heads, head_dim, BLOCK]   (each block transposed, as the CPU kernel wants;
          here a block is one [head_dim, BLOCK] tile, the right-hand side of q . k)
  values [num_blocks * BLOCK, kv_heads, value_dim] (slot = block * BLOCK + offset)

One program = one key head and a tile of up to `tokens` queries of one row, each with every query
head of that key head's group (GQA): `tokens * group` query vectors share each key block's load.
Over the row's blocks, read through its block table, an online softmax (running max, running sum,
rescaled accumulator) in fp32. The grid is fixed by the tensors' shapes (N // tokens + R tiles: a
row's tiles start at query_starts[r] // tokens + r, vLLM's unified kernel's numbering), never by
their values, so a launch needs no host sync and a CUDA graph can capture it; tiles past their
row's tokens do nothing. The row count is an argument, not a compile-time constant (only its power
of 2 is): a step with a new number of rows does not compile the kernel again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 16  # the engine's block size (omnistage/ar/block_manager.py)
QUERY_VECTORS = 64
"""Query vectors (tokens x heads of a group) per program: the rows of its q . k tile."""


@triton.jit
def attend_blocks(query, keys, values, tables, query_starts, context_lens, out, scale,
                  q_token_stride, q_head_stride, table_width, num_rows,
                  ROWS_PAD: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                  TOKENS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, VALUE_DIM: tl.constexpr,
                  VALUE_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, IEEE: tl.constexpr):
    """One program: tile `program_id(0)` of the step's rows' query tiles, key head `program_id(1)`.
    IEEE (fp32 pools): the matmuls in full fp32, not TF32, so fp32 stages match the gather path."""
    tile = tl.program_id(0)
    g = tl.program_id(1)
    # the row: how many rows' first tiles are at or before this one
    r_offs = tl.arange(0, ROWS_PAD)
    row_ends = tl.load(query_starts + 1 + r_offs, mask=r_offs < num_rows, other=0)
    row_first_tiles = row_ends // TOKENS + r_offs + 1  # row r + 1's first tile
    r = tl.sum(((row_first_tiles <= tile) & (r_offs < num_rows)).to(tl.int32))
    q_start = tl.load(query_starts + r)
    n = tl.load(query_starts + r + 1) - q_start
    q0 = (tile - (q_start // TOKENS + r)) * TOKENS  # the tile's first query in its row
    context = tl.load(context_lens + r)
    first_pos = context - n + q0

    # query vector i: token q0 + i // GROUP_PAD, head g * GROUP + i % GROUP_PAD (padding past GROUP)
    i = tl.arange(0, TOKENS * GROUP_PAD)
    token = q0 + i // GROUP_PAD
    head = g * GROUP + i % GROUP_PAD
    live = (token < n) & (i % GROUP_PAD < GROUP)
    position = first_pos + i // GROUP_PAD
    d = tl.arange(0, DIM_PAD)
    q = tl.load(query + (q_start + token)[:, None] * q_token_stride + head[:, None] * q_head_stride + d[None, :],
                mask=live[:, None] & (d[None, :] < HEAD_DIM), other=0.0)

    j = tl.arange(0, BLOCK_SIZE)
    dv = tl.arange(0, VALUE_PAD)
    m = tl.full([TOKENS * GROUP_PAD], -1.0e38, tl.float32)  # finite: a padding vector's exp stays 0, not nan
    l = tl.zeros([TOKENS * GROUP_PAD], tl.float32)
    acc = tl.zeros([TOKENS * GROUP_PAD, VALUE_PAD], tl.float32)
    # the tile's last query sees keys 0 .. first_pos + TOKENS - 1; a tile past its row reads none
    num_keys = tl.where(q0 < n, tl.minimum(context, first_pos + TOKENS), 0)
    for b in range(0, (num_keys + BLOCK_SIZE - 1) // BLOCK_SIZE):
        block = tl.load(tables + r * table_width + b).to(tl.int64)
        k = tl.load(keys + ((block * KV_HEADS + g) * HEAD_DIM + d[:, None]) * BLOCK_SIZE + j[None, :],
                    mask=d[:, None] < HEAD_DIM, other=0.0)
        if IEEE:
            s = tl.dot(q, k, input_precision="ieee")
        else:
            s = tl.dot(q, k)
        s = s * scale
        key_pos = b * BLOCK_SIZE + j
        s = tl.where(key_pos[None, :] <= position[:, None], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        c = tl.exp(m - m_new)
        l = l * c + tl.sum(p, 1)
        v = tl.load(values + ((block * BLOCK_SIZE + j[:, None]) * KV_HEADS + g) * VALUE_DIM + dv[None, :],
                    mask=dv[None, :] < VALUE_DIM, other=0.0)
        if IEEE:
            acc = acc * c[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * c[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    o = acc / tl.where(live, l, 1.0)[:, None]
    tl.store(out + ((q_start + token)[:, None] * (KV_HEADS * GROUP) + head[:, None]) * VALUE_DIM + dv[None, :],
             o.to(out.dtype.element_ty), mask=live[:, None] & (dv[None, :] < VALUE_DIM))


def _pad(x: int) -> int:
    return max(16, triton.next_power_of_2(x))  # tl.dot's operands: 16 or more along every dim


def paged_attention(query: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor,
                    block_tables: torch.Tensor, query_starts: torch.Tensor, context_lens: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """query [N, H, D] (the last dim contiguous), key_pool [B, H_kv, D, BLOCK] and value_pool
    [B * BLOCK, H_kv, Dv] contiguous, block_tables [R, W], query_starts [R + 1] and context_lens [R]
    int32. Returns [N, H, Dv] in the query's dtype. Triton launches on the current CUDA device: the
    engine steps inside its stage's `device_scope`."""
    if query.dim() != 3 or key_pool.dim() != 4 or value_pool.dim() != 3 or query.stride(2) != 1:
        raise ValueError("paged_attention: query [N, H, D] (head dim contiguous), key_pool [B, H_kv, D, 16], "
                         "value_pool [B * 16, H_kv, Dv]")
    if not (key_pool.is_contiguous() and value_pool.is_contiguous()):
        raise ValueError("paged_attention: contiguous pools")
    if not query.dtype == key_pool.dtype == value_pool.dtype:
        raise ValueError("paged_attention: query and pools must share a dtype")
    if any(t.dtype != torch.int32 or not t.is_contiguous() for t in (block_tables, query_starts, context_lens)):
        raise ValueError("paged_attention: block_tables, query_starts and context_lens must be contiguous int32")
    num_tokens, heads, head_dim = query.shape
    kv_heads, value_dim = key_pool.shape[1], value_pool.shape[2]
    if key_pool.shape[3] != BLOCK or value_pool.shape[0] != key_pool.shape[0] * BLOCK:
        raise ValueError(f"paged_attention: blocks of {BLOCK} tokens")
    if heads % kv_heads or value_pool.shape[1] != kv_heads or key_pool.shape[2] != head_dim:
        raise ValueError("paged_attention: query heads must be a multiple of key heads, and head dims must agree")
    rows = context_lens.numel()
    if query_starts.numel() != rows + 1 or block_tables.shape[0] != rows:
        raise ValueError("paged_attention: one table, start and length per row")
    out = query.new_empty(num_tokens, heads, value_dim)
    constants = launch_constants(query.dtype, heads, kv_heads, head_dim, value_dim, rows)
    grid = (num_tokens // constants["TOKENS"] + rows, kv_heads)
    attend_blocks[grid](query, key_pool, value_pool, block_tables, query_starts, context_lens, out, scale,
                        query.stride(0), query.stride(1), block_tables.shape[1], rows, **constants)
    return out


def launch_constants(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, value_dim: int,
                     rows: int) -> dict[str, int | bool]:
    """`attend_blocks`' compile-time constants for a launch at these shapes (what Triton compiles a
    variant for: a model's shapes and dtype, and the power of 2 of the step's row count)."""
    group = heads // kv_heads
    group_pad = triton.next_power_of_2(group)
    return dict(ROWS_PAD=triton.next_power_of_2(rows), KV_HEADS=kv_heads, GROUP=group, GROUP_PAD=group_pad,
                TOKENS=max(1, QUERY_VECTORS // group_pad), HEAD_DIM=head_dim, DIM_PAD=_pad(head_dim),
                VALUE_DIM=value_dim, VALUE_PAD=_pad(value_dim), BLOCK_SIZE=BLOCK, IEEE=dtype == torch.float32)


def write_keys(key_pool: torch.Tensor, keys: torch.Tensor, slots: torch.Tensor) -> None:
    """keys [N, H_kv, D] into key_pool [B, H_kv, D, BLOCK] at `slots` [N] (int64; slot = block * BLOCK
    + offset). One indexed write, no host sync (so a CUDA graph can capture it)."""
    key_pool[slots // BLOCK, :, :, slots % BLOCK] = keys
