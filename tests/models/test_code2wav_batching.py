"""Qwen3-Omni's (and Qwen3-TTS's) streamed code2wav decodes concurrent streams together: rows whose
windows have the same length share one pass, and each row's audio equals its stream decoded alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def decoder(zoo):
    from omnistage.models.qwen3_omni.code2wav import Code2Wav

    return Code2Wav.load(str(zoo("qwen3-omni", size="tiny")), None, torch.device("cpu"), torch.float32, max_streams=4)


class CountingModel(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model, self.batches = model, []

    def forward(self, codes):
        self.batches.append(codes.shape[0])
        return self.model(codes)


def test_same_length_windows_share_one_pass_and_equal_each_stream_alone(decoder):
    g = torch.Generator().manual_seed(0)
    streams = [torch.randint(0, decoder.codebook_size, (40, decoder.num_quantizers), generator=g) for _ in range(3)]
    parts = [(0, 5), (5, 15), (15, 25), (25, 40)]  # first chunks, then steady ones
    options = {"left_context": 10}
    alone = []
    for codes in streams:
        st = decoder.open_stream(options)
        alone.append(np.concatenate([decoder.decode([codes[a:b]], [st])[0] for a, b in parts]))
    counting = decoder.model = CountingModel(decoder.model)
    # (stream, part) per engine step: stream 1 misses a step, so it runs one part behind
    schedule = [[(0, 0), (1, 0), (2, 0)], [(0, 1), (2, 1)], [(0, 2), (1, 1), (2, 2)],
                [(0, 3), (1, 2), (2, 3)], [(1, 3)]]
    try:
        states = [decoder.open_stream(options) for _ in streams]
        together = [[] for _ in streams]
        for step in schedule:
            pieces = decoder.decode([streams[i][slice(*parts[k])] for i, k in step], [states[i] for i, _ in step])
            for (i, _), piece in zip(step, pieces):
                together[i].append(piece)
    finally:
        decoder.model = counting.model
    # windows: 5 x3 | 15 x2 | 20, 15, 20 | 25, 20, 25 | 25: one pass per length in each step
    assert counting.batches == [3, 2, 2, 1, 2, 1, 1]
    for i in range(3):
        got = np.concatenate(together[i])
        assert got.shape == alone[i].shape
        np.testing.assert_allclose(got, alone[i], atol=1e-6 * np.abs(alone[i]).max())
