"""The scheduler without a model: hand-built token ids stand in for the runner's output
(the shape of vLLM's tests/v1/core/utils.py)."""

from __future__ import annotations

import pytest

from omnistage.ar.sampling_params import SamplingParams
from omnistage.ar.scheduler import Scheduler
from omnistage.ar.sequence import Sequence, SequenceStatus

EOS = 2


def create_scheduler(max_num_seqs=4, max_model_len=64, max_num_batched_tokens=None) -> Scheduler:
    return Scheduler(max_num_seqs, max_model_len, max_num_batched_tokens)


def create_sequences(n, prompt_len=4, max_model_len=64, **params) -> list[Sequence]:
    params = {"max_tokens": 8, **params}
    return [Sequence(f"r{i}", list(range(10, 10 + prompt_len + i)), SamplingParams(**params),
                     max_model_len=max_model_len, eos_token_ids=(EOS,)) for i in range(n)]


def step(sched: Scheduler, token=7, tokens=None):
    """One schedule + update with every sequence sampling `token` (or `tokens[request_id]`)."""
    batch = sched.schedule()
    assert batch is not None
    ids = [tokens.get(s.request_id, token) if tokens else token for s in batch.seqs]
    return batch, sched.update(batch, ids)


def test_prefill_then_decode_all_running():
    sched = create_scheduler()
    for s in create_sequences(3):
        sched.add(s)
    batch, _ = step(sched)
    assert batch.is_prefill and batch.first_slot == 0 and [s.slot for s in batch.seqs] == [0, 1, 2]
    batch, _ = step(sched)
    assert not batch.is_prefill and [s.request_id for s in batch.seqs] == ["r0", "r1", "r2"]
    assert all(s.num_output_tokens == 2 for s in batch.seqs)


def test_max_num_seqs_caps_the_running_batch():
    sched = create_scheduler(max_num_seqs=2)
    seqs = create_sequences(3, max_tokens=2)
    for s in seqs:
        sched.add(s)
    batch, _ = step(sched)
    assert [s.request_id for s in batch.seqs] == ["r0", "r1"] and len(sched.waiting) == 1
    batch, finished = step(sched)  # decode: both reach max_tokens
    assert {s.request_id for s in finished} == {"r0", "r1"}
    batch, _ = step(sched)
    assert batch.is_prefill and [s.request_id for s in batch.seqs] == ["r2"] and batch.first_slot == 0


def test_join_mid_decode():
    sched = create_scheduler()
    a, b = create_sequences(2)
    sched.add(a)
    step(sched)
    step(sched)
    sched.add(b)
    batch, _ = step(sched)
    assert batch.is_prefill and batch.seqs == [b] and b.slot == 1
    batch, _ = step(sched)
    assert batch.seqs == [a, b] and (a.num_output_tokens, b.num_output_tokens) == (3, 2)  # a waited one step


def test_prefill_token_budget_splits_admission():
    sched = create_scheduler(max_num_seqs=4, max_model_len=16, max_num_batched_tokens=16)
    for s in create_sequences(3, prompt_len=6, max_model_len=16):  # prompts of 6, 7, 8 tokens
        sched.add(s)
    batch, _ = step(sched)
    assert [s.request_id for s in batch.seqs] == ["r0", "r1"]  # 2 rows x 7 = 14 <= 16; 3 x 8 = 24 > 16
    batch, _ = step(sched)
    assert batch.is_prefill and [s.request_id for s in batch.seqs] == ["r2"]


def test_finish_reasons():
    sched = create_scheduler()
    eos, length, stop_id = create_sequences(3, max_tokens=3, stop_token_ids=[99])
    for s in (eos, length, stop_id):
        sched.add(s)
    _, finished = step(sched, tokens={"r0": EOS, "r1": 5, "r2": 99})
    assert (eos.finish_reason, stop_id.finish_reason) == ("stop", "stop") and set(finished) == {eos, stop_id}
    assert eos.output_token_ids == [EOS]  # the stop token is kept in token_ids
    step(sched, 5)
    _, finished = step(sched, 5)
    assert finished == [length] and length.finish_reason == "length" and length.num_output_tokens == 3
    assert not sched.has_unfinished()


def test_min_tokens_defers_eos_and_ignore_eos():
    sched = create_scheduler()
    held, ignoring = create_sequences(2, min_tokens=2, max_tokens=5)
    ignoring.__init__("r1", ignoring.prompt_token_ids, SamplingParams(max_tokens=3, ignore_eos=True),
                      max_model_len=64, eos_token_ids=(EOS,))
    sched.add(held)
    sched.add(ignoring)
    step(sched, EOS)
    assert not held.is_finished and held.needs_min_tokens_mask  # 1 < min_tokens: EOS does not stop it
    step(sched, EOS)
    assert held.finish_reason == "stop" and held.num_output_tokens == 2
    step(sched, EOS)
    assert ignoring.finish_reason == "length" and ignoring.output_token_ids == [EOS] * 3


def test_max_model_len_stops_with_length():
    sched = create_scheduler(max_model_len=8)
    (seq,) = create_sequences(1, prompt_len=6, max_model_len=8, max_tokens=None)
    assert seq.max_tokens == 2
    sched.add(seq)
    step(sched)
    step(sched)
    assert seq.finish_reason == "length" and seq.num_tokens == 8


def test_prompt_longer_than_max_model_len_is_rejected():
    sched = create_scheduler(max_model_len=5)
    (seq,) = create_sequences(1, prompt_len=6, max_model_len=5, max_tokens=1)
    with pytest.raises(ValueError, match=r"6 tokens.*max_model_len=5"):
        sched.add(seq)


def test_finished_slots_are_repacked():
    sched = create_scheduler(max_num_seqs=4)
    seqs = create_sequences(4)
    for s in seqs:
        sched.add(s)
    step(sched)
    # r0 and r2 finish: r3 (slot 3) moves into the hole at slot 0; r1 keeps slot 1
    _, finished = step(sched, tokens={"r0": EOS, "r2": EOS})
    assert set(finished) == {seqs[0], seqs[2]}
    batch = sched.schedule()
    assert batch.slot_moves == [(3, 0)]
    assert [s.request_id for s in batch.seqs] == ["r3", "r1"] and [s.slot for s in batch.seqs] == [0, 1]
    assert seqs[0].slot == -1 and seqs[0].status is SequenceStatus.FINISHED


def test_abort_waiting_and_running():
    sched = create_scheduler(max_num_seqs=2)
    a, b, c = create_sequences(3)
    for s in (a, b, c):
        sched.add(s)
    step(sched)
    assert sched.abort("r2") is c and c.finish_reason == "abort" and not sched.waiting
    assert sched.abort("r0") is a and a.finish_reason == "abort"
    batch = sched.schedule()
    assert batch.seqs == [b] and batch.slot_moves == [(1, 0)]
    assert sched.abort("nope") is None


def test_tokens_of_a_sequence_aborted_during_its_step_are_dropped():
    sched = create_scheduler()
    a, b = create_sequences(2)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    sched.abort("r0")
    sched.update(batch, [5, 5])
    assert a.output_token_ids == [] and b.output_token_ids == [5]


def test_idle_scheduler_returns_none():
    assert create_scheduler().schedule() is None
    with pytest.raises(ValueError, match="max_num_seqs"):
        Scheduler(0, 16)
