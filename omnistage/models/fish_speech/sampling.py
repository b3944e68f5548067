"""Fish Speech's sampling, as the authors' `text2semantic.inference` (fish-speech 0.1.0):
repetition penalty over a window of recent tokens, top-p (the token that crosses the mass is
cut too), then temperature, then one exponential-race draw (argmax of probs / Exp(1)).

The authors hold temperature, top-p and the penalty as bf16 tensors, so their values are
rounded to bf16 here too. Draws come from the request's own generator, one per sampled
token in the authors' order, so codes equal theirs for the same seed whatever else is in the
batch. Temperature 0 is greedy (argmax after the penalty; no draw): the authors' own floor,
temperature 1e-5, makes the same pick.
"""

from __future__ import annotations

import torch

WINDOW = 16
"""Recent frames the penalty looks at (the authors' `win_size`)."""


def bf16(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.bfloat16))


def sample(logits: torch.Tensor, temperature: float, top_p: float, penalty: float, previous: torch.Tensor | None,
           generator: torch.Generator) -> int:
    """logits [V] (fp32, changed in place) -> one id. `previous`: ids to penalise (repeats allowed)."""
    if previous is not None:
        previous = previous.long()
        score = torch.gather(logits, dim=-1, index=previous)
        score = torch.where(score < 0, score * bf16(penalty), score / bf16(penalty))
        logits.scatter_(dim=-1, index=previous, src=score)
    if temperature == 0:
        return int(torch.argmax(logits))
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cum_probs = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    remove = cum_probs > bf16(top_p)
    remove[0] = False
    logits = logits.masked_fill(remove.scatter(dim=-1, index=sorted_indices, src=remove), -float("inf"))
    probs = torch.softmax(logits / max(bf16(temperature), bf16(1e-5)), dim=-1)
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return int(torch.argmax(probs / race))


def penalty_window(frames: list[torch.Tensor], step: int) -> torch.Tensor | None:
    """The ids [1 + codebooks, WINDOW] the authors penalise at generated frame `step` (0 = the
    prefill's, unpenalised): the decode loop's last WINDOW frames, which leave out the prefill's
    frame, padded with zeros (id 0 then counts as seen) while fewer than WINDOW."""
    if step == 0:
        return None
    recent = frames[max(1, step - WINDOW):step]
    window = torch.zeros(frames[0].shape[0], WINDOW, dtype=torch.long)
    if recent:
        window[:, :len(recent)] = torch.stack(recent, dim=1)
    return window
