"""Attention over a packed step: each row's queries against its own keys only.

The runner lays a packed step (`ModelInput.packed`) out as

    tokens [1, N]: the decode rows' one token each, then each prompt row's chunk;
    keys   [1, K]: the decode rows' contexts, each padded to the longest (M), then each
                   prompt row's whole context (its cached keys, then the chunk's);

and hands the layers a `PackedAttention` in place of a mask tensor. `packed_sdpa`, registered
with transformers' `AttentionInterface` (its public door for attention kernels), then runs
transformers' own SDPA attention once over the decode rows, batched `[B_d, 1] x [B_d, M]`,
and once per prompt row, `[n] x [context]`: the same work as the padded layout's forwards,
where one mask over all of N x K would grow with every row's context. A `PagedLayout` (the same
flattened tokens, the keys read from the KV blocks in place) goes to paged_attention.py's
kernel. Anything else (a mask tensor or None: the padded layouts) goes straight to SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from omnistage.ar.paged_attention import PagedLayout, attend_in_place

ATTN_IMPLEMENTATION = "omnistage_packed_sdpa"  # "sdpa" in the name: transformers checks SDPA support


@dataclass
class PromptRow:
    first_token: int
    """Where the row's chunk starts in the packed tokens."""
    start: int
    """Position of the chunk's first token (its keys before it are cached)."""
    num_tokens: int
    first_key: int
    """Where the row's context starts in the packed keys."""
    num_keys: int
    """Its keys: `start + num_tokens` rounded up to whole blocks (the tail is the last block's rest)."""
    mask: torch.Tensor | None
    """[1, 1, n, num_keys] bool; None: plain causal, SDPA's is_causal path (which skips the masked
    blocks): a chunk from position 0 reads its first n keys, and a chunk after `start` cached keys
    is the last n queries of the causal square over its context (see `_causal_rows`)."""


@dataclass
class PackedAttention:
    num_decodes: int
    decode_len: int
    """M: the longest decode context in whole blocks; each decode row's keys are padded to it."""
    decode_positions: torch.Tensor
    """[B_d] each decode token's position."""
    decode_mask: torch.Tensor | None
    """[B_d, 1, 1, M] bool: a row's keys up to its position (the rest is padding)."""
    prompts: list[PromptRow]

    def windowed(self, window: int) -> PackedAttention:
        """The same layout for sliding-window layers: keys more than `window - 1` positions back are hidden."""
        keys = torch.arange(self.decode_len, device=self.decode_positions.device)
        decode_mask = None
        if self.num_decodes:
            decode_mask = self.decode_mask & (keys > self.decode_positions[:, None] - window).view(
                self.num_decodes, 1, 1, -1)
        prompts = []
        for row in self.prompts:
            queries = torch.arange(row.start, row.start + row.num_tokens, device=keys.device)[:, None]
            context = torch.arange(row.num_keys, device=keys.device)
            mask = (context <= queries) & (context > queries - window)
            prompts.append(replace(row, mask=mask[None, None]))
        return replace(self, decode_mask=decode_mask, prompts=prompts)


def packed_sdpa(module, query, key, value, attention_mask, **kwargs):
    if isinstance(attention_mask, PagedLayout):  # key and value are the KV pools (paged_attention.py)
        return attend_in_place(module, query, key, value, attention_mask, **kwargs)
    if not isinstance(attention_mask, PackedAttention):
        return sdpa(module, query, key, value, attention_mask, **kwargs)
    layout, outputs = attention_mask, []
    d, m = layout.num_decodes, layout.decode_len
    if d:
        rows = query[0, :, :d].transpose(0, 1)[:, :, None]  # [B_d, H, 1, D]
        keys = key[0, :, :d * m].unflatten(1, (d, m)).transpose(0, 1)  # [B_d, H_kv, M, D]
        values = value[0, :, :d * m].unflatten(1, (d, m)).transpose(0, 1)
        out, _ = sdpa(module, rows, keys, values, layout.decode_mask, **kwargs)  # [B_d, 1, H, D]
        outputs.append(out.transpose(0, 1))
    for row in layout.prompts:
        tokens = slice(row.first_token, row.first_token + row.num_tokens)
        context = slice(row.first_key, row.first_key + row.num_keys)
        if row.mask is None and row.start:
            out = _causal_rows(module, query[:, :, tokens], key[:, :, context], value[:, :, context], row.start,
                               **kwargs)
        else:
            out, _ = sdpa(module, query[:, :, tokens], key[:, :, context], value[:, :, context], row.mask, **kwargs)
        outputs.append(out)
    return torch.cat(outputs, dim=1), None


def _causal_rows(module, query, key, value, start: int, **kwargs) -> torch.Tensor:
    """A chunk after `start` cached keys as the last rows of a causal square: `start` zero queries
    go in front, so SDPA's is_causal path (top-left aligned) gives each chunk query its keys up to
    its own position, and skips the masked blocks a chunk x context mask makes it compute. For a
    952-token chunk after 48 keys: 26 against 45 ms (CPU, one thread); worth it while `start` is
    under the chunk's length (the runner decides)."""
    padded = torch.cat([query.new_zeros(*query.shape[:2], start, query.shape[-1]), query], dim=2)
    ctx = padded.shape[2]  # a square: no kernel's alignment of a non-square causal mask matters
    out, _ = sdpa(module, padded, key[:, :, :ctx], value[:, :, :ctx], None, **kwargs)  # [1, ctx, H, D]
    return out[:, start:]


_PLAIN_KWARGS = {"dropout", "scaling", "sliding_window", "position_ids", "use_cache", "output_hidden_states",
                 "output_attentions"}
"""What Qwen2-style layers hand the attention function; anything else (a position bias, sinks,
a softcap) goes to transformers' SDPA, which knows it."""


def sdpa(module, query, key, value, mask, **kwargs):
    """transformers' SDPA, except a masked prompt chunk with grouped key heads on CPU.
    transformers copies each key and value head once per query head before a masked
    multi-token SDPA (CUDA's fast kernels need it); torch's CPU flash kernel takes the grouped
    heads and the mask as they are. On the small zoo LLM the copies of 2000 cached keys per
    layer were 22% of a 16-token chunk's step beside 4 streams."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (query.device.type != "cpu" or mask is None or query.shape[2] == 1 or groups == 1
            or kwargs.get("dropout", 0.0) or not set(kwargs) <= _PLAIN_KWARGS):
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, mask, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask,
                                                           scale=kwargs.get("scaling"), enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTN_IMPLEMENTATION, packed_sdpa)
