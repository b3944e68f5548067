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
