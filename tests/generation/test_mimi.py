"""Streaming, batched Mimi decode (the codec inside the zoo's CSM checkpoint) vs one-shot decode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.core.types import StageRequest
from omnistage.generation.engine import GenerationEngine
from omnistage.generation.mimi import MimiDecoder

STAGE = StageSpec(id=0, name="codec", kind="generation", output="audio", model="mimi")
# Chunked decode equals one-shot decode up to float32 rounding; measured max |diff| ~2e-6
# against a peak amplitude of ~5 (random weights are not clipped to [-1, 1]).
ATOL = 1e-4


@pytest.fixture(scope="module")
def reference_codec(csm_path):
    """The codec as transformers loads it inside CsmForConditionalGeneration."""
    from transformers import CsmForConditionalGeneration

    return CsmForConditionalGeneration.from_pretrained(csm_path, dtype=torch.float32).codec_model.eval()


@pytest.fixture(scope="module")
def codes():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 2048, (n, 8), generator=g) for n in (30, 17, 23)]


def one_shot(codec, c: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return codec.decode(c.T[None]).audio_values[0, 0].numpy()


def test_ragged_chunks_of_three_streams_in_shared_passes(csm_path, reference_codec, codes):
    dec = MimiDecoder.load(csm_path, None, torch.device("cpu"), torch.float32, max_streams=4)
    assert (dec.sample_rate, dec.samples_per_frame) == (24000, 1920)
    states = [dec.open_stream() for _ in codes]
    pieces, pos, sizes, k = [[] for _ in codes], [0] * 3, [7, 5, 3, 9, 1, 12], 0
    while any(p < c.shape[0] for p, c in zip(pos, codes)):
        rows = [i for i in range(3) if pos[i] < codes[i].shape[0]]
        chunks = []
        for i in rows:
            chunks.append(codes[i][pos[i]:pos[i] + sizes[(k + i) % len(sizes)]])
            pos[i] += chunks[-1].shape[0]
        for i, audio in zip(rows, dec.decode(chunks, [states[i] for i in rows])):
            assert audio.dtype == np.float32 and len(audio) == chunks[rows.index(i)].shape[0] * 1920
            pieces[i].append(audio)
        k += 1
    for i, c in enumerate(codes):
        audio, ref = np.concatenate(pieces[i]), one_shot(reference_codec, c)
        assert audio.shape == (c.shape[0] * 1920,) == ref.shape
        np.testing.assert_allclose(audio, ref, atol=ATOL, rtol=0)
    for s in states:
        dec.close_stream(s)


def test_keys_beyond_the_window_are_dropped_and_state_freed(csm_path, reference_codec, codes, monkeypatch):
    # A window of 8 positions (the zoo's 250 is longer than any test stream): the stream keeps 7 keys a layer.
    monkeypatch.setattr(reference_codec.decoder_transformer.config, "sliding_window", 8)  # the one-shot mask reads it
    dec = MimiDecoder.load(csm_path, None, torch.device("cpu"), torch.float32, max_streams=1)
    dec.window = 8
    state = dec.open_stream()
    pieces = [dec.decode([codes[0][i:i + 6]], [state])[0] for i in range(0, 30, 6)]
    assert all(k.shape[1] == 7 for k in state.kv.keys)
    ref = one_shot(reference_codec, codes[0])
    np.testing.assert_allclose(np.concatenate(pieces), ref, atol=ATOL, rtol=0)
    monkeypatch.setattr(reference_codec.decoder_transformer.config, "sliding_window", 250)
    assert np.abs(one_shot(reference_codec, codes[0]) - ref).max() > 5 * ATOL  # the window is exercised
    dec.close_stream(state)
    assert not dec.live and state.kv.keys[0] is None


def test_engine_streams_pieces_then_the_whole(csm_path, reference_codec, codes):
    eng = GenerationEngine(csm_path, STAGE, StageDeployConfig(devices=("cpu",), max_num_seqs=2), chunk_frames=8)
    for i, c in enumerate(codes):
        eng.add_request(StageRequest(f"r{i}", c))
    outs = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            outs.setdefault(o.request_id, []).append(o)
    for i, c in enumerate(codes):
        *chunks, last = outs[f"r{i}"]
        assert all(o.payload.is_chunk and len(o.payload.audio) == 8 * 1920 for o in chunks)
        assert len(chunks) == (c.shape[0] - 1) // 8 and last.finished and not last.payload.is_chunk
        assert last.payload.sample_rate == 24000 and last.metrics["audio_seconds"] == pytest.approx(c.shape[0] / 12.5)
        np.testing.assert_allclose(last.payload.audio, one_shot(reference_codec, c), atol=ATOL, rtol=0)
    eng.close()


def test_codes_are_validated(csm_path):
    dec = MimiDecoder.load(csm_path, None, torch.device("cpu"), torch.float32, max_streams=1)
    with pytest.raises(ValueError, match=r"\[frames, 8\]"):
        dec.parse(torch.zeros(4, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="2048"):
        dec.parse(torch.full((2, 8), 2048))
    with pytest.raises(ValueError, match="integers"):
        dec.parse(torch.zeros(2, 8))
