"""Moshi on the tiny zoo checkpoint: parity with transformers (text tokens, audio codes,
waveform; greedy) for a user clip sent whole or in pieces while the model runs.

The reference is `moshi_reference.reference_duplex`, transformers' own per-position calls
with the user's stream in the user channel; on silence it is `generate` itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import Omni
from omnistage.ar import SamplingParams
from omnistage.ar.engine import AREngine
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.types import InputChunk, StageRequest
from omnistage.models.moshi import MOSHI
from moshi_reference import reference_duplex

NUM_STEPS = 10
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_STEPS)
RATE = 24000


def _clip(frames: int = 5) -> np.ndarray:
    t = np.arange(frames * 1920) / RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * np.random.RandomState(0).randn(t.size)).astype(np.float32)


@pytest.fixture(scope="module")
def moshi(zoo):
    return str(zoo("moshi"))


@pytest.fixture(scope="module")
def model(moshi):
    from transformers import MoshiForConditionalGeneration

    return MoshiForConditionalGeneration.from_pretrained(moshi).eval()


def test_reference_loop_is_generate_on_silence(model):
    out = model.generate(max_new_tokens=6, do_sample=False, depth_decoder_do_sample=False, return_audio_codes=True)
    tokens, codes, waveform = reference_duplex(model, np.zeros(0, np.float32), 6)
    assert tokens == out.sequences[0, 1:].tolist()
    assert torch.equal(codes.T, out.audio_codes[0])
    np.testing.assert_array_equal(waveform, out.audio_sequences[0, 0].numpy())


def _run(moshi: str, requests: dict[str, list[dict]]) -> dict[str, tuple[list[int], torch.Tensor]]:
    """Each request's (text tokens, audio codes) from the AR stage alone, all in one batch; a
    request's later inputs arrive one per step, while it runs."""
    engine = AREngine(moshi, MOSHI.stages[0], StageDeployConfig(max_num_seqs=len(requests)))
    pending = {rid: list(inputs) for rid, inputs in requests.items()}
    for rid, inputs in pending.items():
        engine.add_request(StageRequest(rid, inputs.pop(0), GREEDY))
    last, largest = {}, 0
    while engine.has_unfinished_requests() or any(pending.values()):
        for rid, inputs in pending.items():
            if inputs:
                engine.add_request(StageRequest(rid, InputChunk(inputs.pop(0))))
        outputs = engine.step()
        largest = max(largest, len(outputs))
        last.update({o.request_id: o for o in outputs})
    engine.close()
    assert largest == len(requests)  # every step ran them together
    return {rid: (o.payload.token_ids, o.payload.extras["audio_codes"]) for rid, o in last.items()}


def test_tokens_and_codes_match_the_reference(moshi, model):
    clip = _clip()
    ref_tokens, ref_codes, _ = reference_duplex(model, clip, NUM_STEPS)
    silent_tokens, silent_codes, _ = reference_duplex(model, np.zeros(0, np.float32), NUM_STEPS)
    cuts = [0, 1000, 5000, 7000, clip.size]  # pieces that split frames; the last one closes the input
    pieces = [{"audio": clip[a:b], "final": b == clip.size} for a, b in zip(cuts, cuts[1:])]
    got = _run(moshi, {"whole": [{"audio": clip, "final": True}], "pieces": pieces,
                       "silent": [{"audio": np.zeros(0, np.float32), "final": True}]})
    for rid in ("whole", "pieces"):
        assert got[rid][0] == ref_tokens
        assert torch.equal(got[rid][1], ref_codes)
    assert got["silent"][0] == silent_tokens and torch.equal(got["silent"][1], silent_codes)
    assert got["whole"][0] != silent_tokens  # what the user says changes the reply


def test_waveform_matches_the_reference_with_packed_linears(moshi, model, monkeypatch):
    """The whole pipeline (Moshi, then the streamed Mimi decoder), with every linear layer
    packed (core/cpu_linear.py; the zoo model's are all below the size where that pays): the
    reference's text and its waveform up to rounding."""
    from packed_linears import assert_every_stage_packed, pack_every_linear

    pack_every_linear(monkeypatch)
    clip = _clip()
    ref_tokens, _, ref_audio = reference_duplex(model, clip, NUM_STEPS)
    with Omni(moshi) as omni:
        assert_every_stage_packed(omni)
        out = omni.generate({"audio": clip, "final": True}, {"moshi": GREEDY}, use_tqdm=False)[0]
    assert out.token_ids == ref_tokens
    assert out.sample_rate == RATE and out.audio.shape == ref_audio.shape == ((NUM_STEPS - 1) * 1920,)
    np.testing.assert_allclose(out.audio, ref_audio, atol=1e-4 * np.abs(ref_audio).max())


def test_a_waiting_stream_is_freed_by_abort(moshi):
    """A streamed request waits for the user's next frame without running steps; aborting it
    (a session that ends) frees its place in the batch and its KV blocks."""
    engine = AREngine(moshi, MOSHI.stages[0], StageDeployConfig(max_num_seqs=2))
    free_blocks = engine.block_manager.num_free_blocks
    engine.add_request(StageRequest("s", {"audio": _clip(2)}, GREEDY))
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    assert steps == 3  # position 0, then one step per frame heard; then it waits
    engine.abort_request("s")
    [out] = engine.step()
    assert out.finished and out.payload.finish_reason == "abort"
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert engine.block_manager.num_free_blocks == free_blocks
    engine.close()
