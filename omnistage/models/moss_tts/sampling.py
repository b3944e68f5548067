"""MOSS-TTS's sampling, as the authors' `moss_tts_lite.sampling` (itself a port of the
model's `inference_utils`): repetition penalty over the codes so far, top-k, top-p with the
shifted cutoff, one multinomial draw per row. Draws come from the request's own generator,
in the authors' order, so a request's codes are the authors' for the same seed whatever
else is in the batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    v, i = torch.topk(logits, min(k, logits.shape[-1]), dim=-1)
    return torch.full_like(logits, float("-inf")).scatter_(-1, i, v)


def _top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    sp, si = torch.sort(F.softmax(logits, dim=-1), descending=True, dim=-1)
    remove = torch.cumsum(sp, dim=-1) > p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    logits[torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, si, remove)] = float("-inf")
    return logits


def repetition_penalty(logits: torch.Tensor, prev: torch.Tensor, penalty: float) -> torch.Tensor:
    """In place on logits [R, V]: every code in `prev` penalised in every row. The authors call it
    with codebook 0's history for codebook 0, and with the other 31 codebooks' histories together
    for the rest (their delay-pattern helper folds the codebooks into one set)."""
    if penalty == 1.0:
        return logits
    u = torch.unique(prev.reshape(-1))
    if u.numel():
        t = logits[:, u]
        pos = t > 0
        t[pos] /= penalty
        t[~pos] *= penalty
        logits[:, u] = t
    return logits


def sample(logits: torch.Tensor, top_k: int | None, top_p: float | None, greedy: bool,
           generator: torch.Generator) -> torch.Tensor:
    """[R, V] -> [R] ids."""
    if greedy:
        return torch.argmax(logits, dim=-1)
    if top_k:
        logits = _top_k(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = _top_p(logits, top_p)
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator).view(-1)
