"""Ring attention (`ring_degree`), composable with Ulysses: attention over a token sequence
split across ranks, exact up to float rounding.

Each rank keeps its query chunk and passes its key/value chunk around the ring (send to
the next rank, receive from the previous) while it attends to the chunk it holds, merging
the partial results with the online-softmax rule (each chunk's output weighted by its
log-sum-exp), so no rank ever holds more than two chunks of keys and values. With a
Ulysses degree too, heads are first exchanged all-to-all inside the Ulysses group (each
rank then holds the ring chunk's whole sequence for 1/U of the heads) and exchanged back
after.

diffusers' own ring attention needs an attention op that returns the log-sum-exp, which
no CPU (or fp32) backend of its dispatcher has, so a family that takes `ring_degree`
declares its own attention processor (`SequencePlan.ring_processor`, in its folder, e.g.
models/z_image/parallel.py) that calls `sequence_parallel_attention` here (directly, or through
sequence_split.SplitSequence with the mask of padded tokens), which uses torch's
fused kernels that return it (`attention_with_lse`: flash on CPU, memory-efficient on CUDA,
any dtype); families that declare none are refused by name.
"""

from __future__ import annotations

from typing import Any

import torch


def all_to_all_heads(x: torch.Tensor, group: Any, *, gather_sequence: bool) -> torch.Tensor:
    """Ulysses' exchange. gather_sequence: [B, S, H, D] -> [B, U*S, H/U, D] (the group's
    sequence for this rank's heads); else the inverse."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    if gather_sequence:
        b, s, h, d = x.shape
        send = x.reshape(b, s, world, h // world, d).permute(2, 0, 1, 3, 4).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)  # [U (source rank's chunk), B, S, H/U, D]
        return recv.permute(1, 0, 2, 3, 4).reshape(b, world * s, h // world, d)
    b, us, hu, d = x.shape
    send = x.reshape(b, world, us // world, hu, d).permute(1, 0, 2, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # [U (source rank's heads), B, S, H/U, D]
    return recv.permute(1, 2, 0, 3, 4).reshape(b, us // world, world * hu, d)


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor | None,
                   group: Any) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v over the whole ring's keys, for this rank's queries.
    query/key/value: [B, S, H, D], this rank's chunk (rank r holds tokens r*S..(r+1)*S);
    key_mask: None or bool [B, S * ring] over all keys (False = padding)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    ranks = dist.get_process_group_ranks(group)
    seq = key.shape[1]
    q = query.transpose(1, 2)  # [B, H, S, D]
    kv = torch.stack([key, value]).contiguous()
    out = lse = None
    source = rank  # whose chunk `kv` is
    for step in range(world):
        pending = []
        if step < world - 1:
            incoming = torch.empty_like(kv)
            pending = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, kv, ranks[(rank + 1) % world], group),
                dist.P2POp(dist.irecv, incoming, ranks[(rank - 1) % world], group),
            ])
        k, v = (t.transpose(1, 2) for t in kv)
        chunk_mask = None if key_mask is None else key_mask[:, source * seq:(source + 1) * seq]
        chunk_out, chunk_lse = attention_with_lse(q, k, v, chunk_mask)
        if out is None:
            out, lse = chunk_out, chunk_lse
        else:
            merged = torch.logaddexp(lse, chunk_lse)
            out = out * torch.exp(lse - merged) + chunk_out * torch.exp(chunk_lse - merged)
            lse = merged
        for request in pending:
            request.wait()
        if pending:
            kv, source = incoming, (source - 1) % world
    return out.transpose(1, 2).to(query.dtype)


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       key_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(d)) v and its log-sum-exp, from a fused attention kernel that returns
    both (no [B, H, S, S] scores in memory): q/k/v [B, H, S, D] in their own dtype; key_mask None
    or bool [B, S_kv] (False = padding). Returns the output in fp32 [B, H, S, D] and the lse
    [B, H, S, 1]; a row whose keys are all padding gets output 0 and lse -inf (it adds nothing)."""
    scale = q.shape[-1] ** -0.5
    bias = None
    if key_mask is not None:
        # An additive bias over keys, broadcast over heads and queries. The CUDA kernel reads it
        # in rows padded to 16 keys (as F.scaled_dot_product_attention lays it out).
        s_kv = key_mask.shape[-1]
        padded = q.new_zeros(key_mask.shape[0], 1, 1, -(-s_kv // 16) * 16)[..., :s_kv]
        bias = padded.masked_fill_(~key_mask[:, None, None, :], float("-inf"))
        bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], s_kv)
    if q.is_cuda:
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, compute_log_sumexp=True, scale=scale)[:2]
        lse = lse[..., :q.shape[2]]  # the kernel pads the query rows of its lse
    else:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias, scale=scale)
    lse = lse.float()[..., None]
    out = out.float()
    if key_mask is not None:  # the kernels give an all-padding row a finite lse: it must add nothing
        empty = ~key_mask.any(dim=-1)[:, None, None, None]
        lse = lse.masked_fill(empty, float("-inf"))
        out = out.masked_fill(empty, 0.0)
    return out, lse


def sequence_parallel_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                key_mask: torch.Tensor | None, groups: Any) -> torch.Tensor:
    """Attention for this rank's chunk of a sequence split over ring x ulysses ranks."""
    ulysses = groups.mesh["ulysses"].get_group()
    use_ulysses = groups.degrees.ulysses > 1
    if use_ulysses:
        query, key, value = (all_to_all_heads(t, ulysses, gather_sequence=True) for t in (query, key, value))
    out = ring_attention(query, key, value, key_mask, groups.mesh["ring"].get_group())
    return all_to_all_heads(out, ulysses, gather_sequence=False) if use_ulysses else out
