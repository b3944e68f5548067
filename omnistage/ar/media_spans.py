"""Media items behind a prompt's placeholder tokens, as the prefix cache keys them.

A placeholder id (<|IMAGE|>, <|AUDIO|>, ...) is the same for every clip, image and video,
so a block's token ids alone do not say what its keys were computed from. As vLLM does, a
family that encodes media says where each item sits in the prompt and gives it a content
digest (`MediaSpan`); the block manager folds the digests of the items a block overlaps into
that block's key (`block_digests`), so two blocks key alike only if their tokens and the
media behind them are equal. Block keys chain, so a later block's key covers all media
before it too.

A digest (`media_digest`) is made from the item's decoded content (an image's pixel array,
a clip's samples and rate, a video's sampled frames) plus the request options that change
its features or its tokens' positions (seconds per frame, whether a video's audio is heard);
the processing in between is the model's own, the same for every request. On a hit the
family's prefill merges features into the positions it feeds only (`fed_rows`).

A prompt fed as embeddings (a talker's, made of its thinker's rows: its ids are one
placeholder repeated) is keyed the same way by `row_spans`: one span per `ROWS_PER_DIGEST`
rows, digesting the rows as fed and their positions. Equal keys then mean equal inputs
bit for bit, so a hit computes what the uncached forward would have from the same rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class MediaSpan:
    """One media item of a prompt: the positions [start, start + length) its tokens take, and its digest."""

    start: int
    length: int
    digest: bytes

    @property
    def end(self) -> int:
        return self.start + self.length


def media_digest(*parts: Any) -> bytes:
    """A content digest of `parts`: arrays (numpy or torch: dtype, shape and bytes) and plain values (their repr)."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        if hasattr(part, "detach"):  # a torch tensor
            part = part.detach().cpu().contiguous().numpy()
        if isinstance(part, np.ndarray):
            part = np.ascontiguousarray(part)
            h.update(f"{part.dtype.str}{part.shape}".encode())
            h.update(part.data)
        else:
            h.update(repr(part).encode())
        h.update(b"\x00")
    return h.digest()


def block_digests(spans: tuple[MediaSpan, ...], start: int, end: int) -> tuple[bytes, ...]:
    """The digests of the items whose positions overlap [start, end), in prompt order."""
    return tuple(s.digest for s in spans if s.start < end and s.end > start)


def fed_rows(features: Any, mask: Any) -> Any:
    """The rows of `features` (one per placeholder of the prompt, in order) for the placeholders a
    prefill feeds (`mask` over its ids): the last ones, since a prefix-cache hit skips the prompt's
    start and a media prompt's prefill is all the rest (the engine never chunks or recomputes it)."""
    return features[len(features) - int(mask.sum()):]


ROWS_PER_DIGEST = 16
"""Rows one span of `row_spans` digests (the AR engine's block size: one digest per block)."""


def row_spans(rows: Any, positions: Any, start: int = 0, end: int | None = None) -> tuple[MediaSpan, ...]:
    """Spans over rows [start, end) of a prompt fed as embeddings: `rows` [L, H] (the whole prompt's,
    as fed) and `positions` [..., L] (what each row's position is, e.g. M-RoPE's three). Spans are
    aligned to multiples of `ROWS_PER_DIGEST` from an aligned `start`, so a streamed prompt digests
    its complete groups first and the rest once its last rows come."""
    import torch

    if start % ROWS_PER_DIGEST:
        raise ValueError(f"row_spans: start {start} is not a multiple of {ROWS_PER_DIGEST}")
    end = rows.shape[0] if end is None else end
    if end == start:  # nothing to digest yet: a streamed prompt shorter than one group (a short omni chat turn)
        return ()
    # One copy to the host; each row's bytes as fed (numpy has no bfloat16).
    data = rows[start:end].detach().contiguous().view(torch.uint8).cpu().numpy()
    where = positions[..., start:end].detach().reshape(-1, end - start).T.contiguous().cpu().numpy()
    kind = str(rows.dtype)
    spans = []
    for a in range(0, end - start, ROWS_PER_DIGEST):
        b = min(a + ROWS_PER_DIGEST, end - start)
        spans.append(MediaSpan(start + a, b - a, media_digest("rows", kind, data[a:b], where[a:b])))
    return tuple(spans)
