"""The sampler's draw: unseeded rows sample exactly from the processed distribution."""

from __future__ import annotations

import pytest
import torch

from omnistage.ar.sampler import Sampler
from omnistage.ar.sampling_params import SamplingParams
from omnistage.ar.sequence import Sequence

PROBS = torch.tensor([0.05, 0.15, 0.3, 0.5, 0.0])  # the last token is impossible


@pytest.mark.parametrize("top_k", [0, 4], ids=["full-vocabulary", "top-k"])
def test_unseeded_draws_follow_the_distribution(top_k):
    torch.manual_seed(0)
    rows, rounds = 500, 40
    seqs = [Sequence(f"r{i}", [1], SamplingParams(temperature=1.0, top_k=top_k), max_model_len=8)
            for i in range(rows)]
    logits = PROBS.log().expand(rows, -1).clone()
    sampler = Sampler(torch.device("cpu"))
    counts = torch.zeros(len(PROBS))
    for _ in range(rounds):
        counts += torch.bincount(sampler(logits, seqs), minlength=len(PROBS))
    freq = counts / (rows * rounds)
    assert freq[-1] == 0 and torch.allclose(freq, PROBS, atol=0.01)  # 20000 draws: std <= 0.0036


def test_repetition_penalties_of_a_batch_are_one_indexed_update():
    """Each row's penalty on the tokens it has seen (prompt and output, ids past the logits' width
    ignored), as transformers' processor applies it to that row, in one update for the batch."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import RepetitionPenaltyLogitsProcessor

    class Updates(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Updates.count += func.overloadpacket.__name__.startswith("index_put")
            return func(*args, **(kwargs or {}))

    histories = [[3, 3, 7, 40], [1, 2], [5, 9, 9, 0, 12], [6], [7, 8, 11, 63, 64]]
    penalties = [1.3, 1.0, 2.0, 0.7, 1.3]
    seqs = [Sequence(f"r{i}", h, SamplingParams(temperature=0, repetition_penalty=p), max_model_len=16)
            for i, (h, p) in enumerate(zip(histories, penalties))]
    logits = torch.randn(len(seqs), 32, generator=torch.Generator().manual_seed(0))
    expected = torch.stack([
        RepetitionPenaltyLogitsProcessor(p)(torch.tensor([[t for t in h if t < 32]]), row[None].clone())[0]
        for row, h, p in zip(logits, histories, penalties)])
    ours = logits.clone()
    with Updates():
        Sampler(torch.device("cpu"))._apply_penalties(ours, seqs)
    assert torch.equal(ours, expected)
    assert Updates.count == 1
