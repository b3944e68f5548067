"""The scheduler and block manager without a model: hand-built token ids stand in for the
runner's output (the shape of vLLM's tests/v1/core/utils.py)."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.ar.block_manager import BlockManager
from omnistage.ar.media_spans import MediaSpan, media_digest
from omnistage.ar.sampling_params import SamplingParams
from omnistage.ar.scheduler import Scheduler
from omnistage.ar.sequence import Sequence, SequenceStatus

EOS = 2
BLOCK = 4


def create_scheduler(max_num_seqs=4, max_model_len=64, max_num_batched_tokens=None, num_blocks=None,
                     prefix_caching=True, chunked=True, packed=False) -> Scheduler:
    blocks = BlockManager(num_blocks or max_num_seqs * max_model_len // BLOCK, BLOCK, prefix_caching)
    return Scheduler(max_num_seqs, max_model_len, blocks, max_num_batched_tokens=max_num_batched_tokens,
                     enable_chunked_prefill=chunked, packed=packed)


def create_sequences(n, prompt_len=4, max_model_len=64, **params) -> list[Sequence]:
    params = {"max_tokens": 8, **params}
    return [Sequence(f"r{i}", list(range(10, 10 + prompt_len + i)), SamplingParams(**params),
                     max_model_len=max_model_len, eos_token_ids=(EOS,)) for i in range(n)]


def step(sched: Scheduler, token=7, tokens=None):
    """One schedule + update with every caught-up sequence sampling `token` (or `tokens[request_id]`)."""
    batch = sched.schedule()
    assert batch is not None
    ids = {i.seq.request_id: (tokens.get(i.seq.request_id, token) if tokens else token)
           for i in batch.items if i.samples}
    return batch, sched.update(batch, ids)


def ids(items) -> list[str]:
    return [i.seq.request_id for i in items]


def assert_no_leak(sched: Scheduler) -> None:
    """Every block is back in the free queue and none is referenced."""
    bm = sched.blocks
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_prefill_then_decode_all_running():
    sched = create_scheduler()
    for s in create_sequences(3):
        sched.add(s)
    batch, _ = step(sched)
    assert ids(batch.prefills) == ["r0", "r1", "r2"] and not batch.decodes
    assert [i.num_new for i in batch.prefills] == [4, 5, 6] and all(i.start == 0 for i in batch.prefills)
    assert [len(s.seq.block_table) for s in batch.prefills] == [1, 2, 2]  # blocks of 4 tokens
    batch, _ = step(sched)
    assert not batch.prefills and ids(batch.decodes) == ["r0", "r1", "r2"]
    assert all(i.num_new == 1 and i.samples for i in batch.decodes)
    assert all(s.num_output_tokens == 2 for s in batch.seqs)


def test_max_num_seqs_caps_the_running_batch():
    sched = create_scheduler(max_num_seqs=2)
    seqs = create_sequences(3, max_tokens=2)
    for s in seqs:
        sched.add(s)
    batch, _ = step(sched)
    assert ids(batch.prefills) == ["r0", "r1"] and len(sched.waiting) == 1
    batch, finished = step(sched)  # decode: both reach max_tokens
    assert {s.request_id for s in finished} == {"r0", "r1"}
    batch, _ = step(sched)
    assert ids(batch.prefills) == ["r2"]
    step(sched)
    assert_no_leak(sched)


def test_a_sequence_made_before_the_waiting_ones_is_admitted_ahead_of_them():
    # A re-run (its replica died) arrives after newer work but was made before it (arrival_time is
    # the orchestrator's): it is admitted before the sequences made after it.
    sched = create_scheduler(max_num_seqs=1)
    seqs = create_sequences(4, max_tokens=1)
    for seq, made in zip(seqs, (1.0, 3.0, 4.0, 2.0)):
        seq.arrival_time = made
        sched.add(seq)
    admitted = []
    while sched.waiting or sched.running:
        batch, _ = step(sched)
        admitted += ids(batch.prefills)
    assert admitted == ["r0", "r3", "r1", "r2"]
    assert_no_leak(sched)


def test_join_mid_decode_shares_the_step():
    sched = create_scheduler()
    a, b = create_sequences(2)
    sched.add(a)
    step(sched)
    step(sched)
    sched.add(b)
    batch, _ = step(sched)
    assert ids(batch.decodes) == ["r0"] and ids(batch.prefills) == ["r1"]  # a keeps decoding
    assert (a.num_output_tokens, b.num_output_tokens) == (3, 1)


def test_token_budget_chunks_a_long_prompt_beside_the_decodes():
    sched = create_scheduler(max_num_seqs=4, max_model_len=64, max_num_batched_tokens=8)
    (a,) = create_sequences(1, prompt_len=3)
    sched.add(a)
    step(sched)
    long = Sequence("long", list(range(100, 120)), SamplingParams(max_tokens=4), max_model_len=64)
    sched.add(long)
    chunks = []
    while not long.output_token_ids:
        batch, _ = step(sched)
        assert ids(batch.decodes) == ["r0"] and batch.num_tokens <= 8  # the running stream never stalls
        chunks.append((batch.prefills[0].start, batch.prefills[0].num_new, batch.prefills[0].samples))
    assert chunks == [(0, 7, False), (7, 7, False), (14, 6, True)]
    assert long.num_computed_tokens == 20 and a.num_output_tokens == 4


@pytest.mark.parametrize("packed", [False, True])
def test_the_budget_counts_padding_unless_the_forward_is_packed(packed):
    sched = create_scheduler(max_num_batched_tokens=8, packed=packed)
    (a,) = create_sequences(1, prompt_len=3)
    sched.add(a)
    step(sched)
    for name, n in (("p3", 3), ("p5", 5)):
        sched.add(Sequence(name, list(range(100, 100 + n)), SamplingParams(max_tokens=2), max_model_len=64))
    batch, _ = step(sched)
    chunks = [(i.seq.request_id, i.num_new) for i in batch.prefills]
    if packed:  # 1 + 3 real tokens leave 4: p5's first chunk
        assert chunks == [("p3", 3), ("p5", 4)] and batch.num_tokens == 8
    else:  # 2 rows padded to 5 would be 10 > 7: p5 waits for a step it fits whole
        assert chunks == [("p3", 3)]


def test_without_chunking_a_long_prompt_waits_then_runs_whole():
    sched = create_scheduler(max_num_batched_tokens=8, chunked=False)
    (a,) = create_sequences(1, prompt_len=3)
    sched.add(a)
    step(sched)
    long = Sequence("long", list(range(100, 120)), SamplingParams(max_tokens=1), max_model_len=64)
    long.recomputable = False
    sched.add(long)
    batch, _ = step(sched)
    assert ids(batch.decodes) == ["r0"] and not batch.prefills  # 1 + 20 > 8: not beside a decode
    a.finish("abort")
    sched.free_finished()
    batch, _ = step(sched)
    assert ids(batch.prefills) == ["long"] and batch.prefills[0].num_new == 20  # alone, past the budget


def test_prefix_cache_hit_skips_the_cached_blocks():
    sched = create_scheduler()
    shared = list(range(50, 62))  # three full blocks
    first = Sequence("first", shared + [1, 2], SamplingParams(max_tokens=1), max_model_len=64)
    sched.add(first)
    step(sched)
    assert first.is_finished and sched.blocks.num_free_blocks == sched.blocks.num_blocks
    second = Sequence("second", shared + [3], SamplingParams(max_tokens=1), max_model_len=64)
    sched.add(second)
    batch, _ = step(sched)
    assert batch.prefills[0].start == 12 and batch.prefills[0].num_new == 1 and second.num_cached_tokens == 12
    # a prompt made of whole cached blocks still computes its last token (for the next token's logits)
    exact = Sequence("exact", list(shared), SamplingParams(max_tokens=1), max_model_len=64)
    sched.add(exact)
    batch, _ = step(sched)
    assert batch.prefills[0].start == 8 and batch.prefills[0].num_new == 4
    assert_no_leak(sched)


def test_media_digests_key_the_blocks_they_overlap():
    # Placeholder ids 9 at positions 2..5 (blocks 0 and 1) stand for an image: the same ids with
    # another image's digest hit no block over it, the same image hits them, and a prompt that
    # appends a second image hits the blocks over the first.
    sched = create_scheduler()
    ids = [50, 51, 9, 9, 9, 9, 52, 53, 54, 55, 56, 57, 1]
    image = MediaSpan(2, 4, media_digest("image", np.zeros((2, 2, 3), np.uint8)))
    other = MediaSpan(2, 4, media_digest("image", np.ones((2, 2, 3), np.uint8)))

    def cached(rid, spans, prompt=ids):
        seq = Sequence(rid, prompt, SamplingParams(max_tokens=1), max_model_len=64, media_spans=spans)
        sched.add(seq)
        step(sched)
        return seq.num_cached_tokens

    assert cached("a", (image,)) == 0
    assert cached("same", (image,)) == 12
    assert cached("other", (other,)) == 0
    assert cached("appended", (image, MediaSpan(10, 4, other.digest)), ids[:10] + [9] * 4 + [1]) == 8
    assert_no_leak(sched)


def test_a_prompt_of_digested_rows_publishes_its_prompt_blocks_only():
    # A talker's prompt: one placeholder id, each block keyed by its rows' digest; its decode steps
    # read rows no digest covers, so blocks of generated tokens stay out of the cache.
    sched = create_scheduler(max_num_seqs=2, max_model_len=16, num_blocks=8)
    rows = [MediaSpan(4 * i, 4, media_digest("rows", i)) for i in range(3)]

    def talker(rid, spans, max_tokens=6):
        seq = Sequence(rid, [9] * 10, SamplingParams(max_tokens=max_tokens), max_model_len=16, media_spans=spans,
                       cache_outputs=False)
        seq.recomputable = False  # its rows are read by the first prefill only
        sched.add(seq)
        return seq

    first = talker("first", tuple(rows))
    while not first.is_finished:
        step(sched)
    assert len(sched.blocks.cached) == 2  # 16 tokens computed: the prompt's two full blocks only
    other_rows = talker("other", (MediaSpan(0, 4, media_digest("rows", "x")), *rows[1:]))
    same_rows = talker("same", (*rows[:2], MediaSpan(8, 4, media_digest("rows", "y"))))
    step(sched)
    assert other_rows.num_cached_tokens == 0 and same_rows.num_cached_tokens == 8
    sched.abort("same")  # mid-decode, on shared blocks
    while sched.has_unfinished():
        step(sched)
    assert_no_leak(sched)


def test_shared_blocks_are_reference_counted():
    sched = create_scheduler()
    shared = list(range(50, 58))
    a = Sequence("a", shared + [1], SamplingParams(max_tokens=4), max_model_len=64)
    sched.add(a)
    step(sched)
    b = Sequence("b", shared + [2], SamplingParams(max_tokens=4), max_model_len=64)
    sched.add(b)
    step(sched)
    assert a.block_table[:2] == b.block_table[:2] and a.block_table[2] != b.block_table[2]
    assert [sched.blocks.blocks[i].ref_count for i in a.block_table[:2]] == [2, 2]
    sched.abort("a")
    assert [sched.blocks.blocks[i].ref_count for i in b.block_table[:2]] == [1, 1]
    sched.abort("b")
    assert_no_leak(sched)


def test_lru_eviction_reuses_unkeyed_then_the_oldest_cached_block():
    sched = create_scheduler(max_num_seqs=1, max_model_len=8, num_blocks=3)

    def one(rid, first):
        seq = Sequence(rid, list(range(first, first + 5)), SamplingParams(max_tokens=1), max_model_len=8)
        sched.add(seq)
        step(sched)  # its first block is full (cached), its second holds one token (nothing to reuse)
        assert seq.is_finished

    one("a", 10)
    one("c", 30)
    assert set(sched.blocks.cached) == {(None, (10, 11, 12, 13)), (None, (30, 31, 32, 33))}
    one("d", 40)  # two blocks: the unkeyed one, then the least recently used cached one (a's)
    assert set(sched.blocks.cached) == {(None, (30, 31, 32, 33)), (None, (40, 41, 42, 43))}
    assert_no_leak(sched)


def test_preemption_frees_the_newest_and_recomputes_it():
    # 4 blocks of 4 tokens; two sequences of 6-token prompts grow past 8 tokens each
    sched = create_scheduler(max_num_seqs=2, max_model_len=16, num_blocks=4, prefix_caching=False)
    a = Sequence("a", list(range(10, 16)), SamplingParams(max_tokens=6), max_model_len=16)
    b = Sequence("b", list(range(20, 26)), SamplingParams(max_tokens=6), max_model_len=16)
    sched.add(a)
    sched.add(b)
    preempted_at = None
    for k in range(20):
        if not sched.has_unfinished():
            break
        batch, _ = step(sched, token=5 + k)
        if batch.preempted:
            preempted_at = k
            assert batch.preempted == [b] and b.status is SequenceStatus.WAITING and not b.block_table
            assert sched.waiting[0] is b
    assert preempted_at is not None and b.num_preemptions == 1
    assert a.num_output_tokens == 6 and b.num_output_tokens == 6 and a.is_finished and b.is_finished
    assert_no_leak(sched)


def test_reserved_sequences_hold_their_whole_length_and_are_never_preempted():
    sched = create_scheduler(max_num_seqs=2, max_model_len=16, num_blocks=4)
    a = Sequence("a", list(range(10, 14)), SamplingParams(max_tokens=8), max_model_len=16)
    a.recomputable = a.prefix_cacheable = False
    sched.add(a)
    step(sched)
    assert len(a.block_table) == 3  # 4 + 8 tokens, reserved at admission
    b = Sequence("b", list(range(20, 26)), SamplingParams(max_tokens=1), max_model_len=16)
    sched.add(b)
    batch, _ = step(sched)
    assert ids(batch.prefills) == [] and len(sched.waiting) == 1  # 2 blocks needed, 1 free: b waits
    while not a.is_finished:
        step(sched)
    step(sched)
    assert b.is_finished
    assert_no_leak(sched)


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


def test_abort_waiting_and_running():
    sched = create_scheduler(max_num_seqs=2)
    a, b, c = create_sequences(3)
    for s in (a, b, c):
        sched.add(s)
    step(sched)
    assert sched.abort("r2") is c and c.finish_reason == "abort" and not sched.waiting
    assert sched.abort("r0") is a and a.finish_reason == "abort" and not a.block_table
    batch = sched.schedule()
    assert batch.seqs == [b]
    assert sched.abort("nope") is None
    sched.abort("r1")
    assert_no_leak(sched)


def test_tokens_of_a_sequence_aborted_during_its_step_are_dropped():
    sched = create_scheduler()
    a, b = create_sequences(2)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    sched.abort("r0")
    sched.update(batch, {"r0": 5, "r1": 5})
    assert a.output_token_ids == [] and b.output_token_ids == [5]


def test_idle_scheduler_returns_none():
    assert create_scheduler().schedule() is None
    with pytest.raises(ValueError, match="max_num_seqs"):
        Scheduler(0, 16, BlockManager(4, BLOCK))


def test_sequences_awaiting_streamed_input_are_passed_over():
    sched = create_scheduler()
    a, b = create_sequences(2)
    a.awaiting_input = True  # its prompt is not all there yet
    sched.add(a)
    sched.add(b)
    batch, _ = step(sched)
    assert ids(batch.prefills) == ["r1"] and list(sched.waiting) == [a]  # b overtook it
    assert sched.has_runnable() and sched.has_unfinished()
    a.awaiting_input = False
    batch, _ = step(sched)
    assert ids(batch.prefills) == ["r0"] and ids(batch.decodes) == ["r1"]
    b.awaiting_input = True  # a running one waiting for its next input row: no decode for it
    batch, _ = step(sched)
    assert ids(batch.decodes) == ["r0"] and not batch.prefills
    a.awaiting_input = True
    assert not sched.has_runnable() and sched.schedule() is None


# --- deadline order (audio streams) ------------------------------------------------------------

def timed_step(sched: Scheduler, now: float) -> list[str]:
    """One schedule + update at wall time `now`; the ids the step ran."""
    batch = sched.schedule()
    sched.update(batch, {i.seq.request_id: 7 for i in batch.items if i.samples}, now=now)
    return ids(batch.items)


def audio_sequence(name: str, arrival: float, frame_seconds: float = 0.08) -> Sequence:
    seq = Sequence(name, [10, 11, 12, 13], SamplingParams(max_tokens=200), max_model_len=256,
                   eos_token_ids=(EOS,), arrival_time=arrival)
    seq.frame_seconds = frame_seconds
    return seq


@pytest.mark.parametrize("deadline_order", [True, False])
def test_deadline_order_runs_a_newcomer_before_streams_far_ahead(deadline_order):
    """Two streams fill the batch (max_num_seqs=2) and are 0.8 s of audio ahead of their listeners;
    a third arrives. Deadline order admits it beside them (the KV blocks allow) and its first
    frames take a seat from a stream that can wait; arrival order keeps it waiting for a seat."""
    sched = Scheduler(2, 256, BlockManager(64, BLOCK), deadline_order=deadline_order)
    a, b = audio_sequence("a", 0.0), audio_sequence("b", 0.0)
    sched.add(a), sched.add(b)
    for i in range(10):
        assert sorted(timed_step(sched, now=0.001 * i)) == ["a", "b"]  # room for both: the order changes nothing
    assert a.playback.runs_out_at == pytest.approx(0.8)
    sched.add(audio_sequence("new", 0.02))
    ran = timed_step(sched, now=0.03)
    if deadline_order:
        assert sorted(ran) == ["a", "new"] and len(sched.running) == 3  # a, b tie: b, admitted last, waits
        assert sorted(timed_step(sched, now=0.04)) == ["b", "new"]  # a got a frame more: b is due first
    else:
        assert sorted(ran) == ["a", "b"] and [s.request_id for s in sched.waiting] == ["new"]


def test_deadline_order_bounds_how_long_late_streams_keep_a_newcomer_waiting():
    """Three streams are late (their listeners ran out of audio long ago and each frame is 1 ms,
    so they never catch up) and hold the batch of 2; a newcomer still gets its first frames
    within two steps: a late stream's deadline restarts at its last audio (the player stalls
    there), the newcomer's stays its arrival, so each late one has at most one turn before it."""
    sched = Scheduler(2, 256, BlockManager(64, BLOCK), deadline_order=True)
    late = [audio_sequence(name, 0.0, frame_seconds=0.001) for name in "abc"]
    for seq in late:
        sched.add(seq)
    for i in range(3):
        timed_step(sched, now=0.1 * i)  # prefills and a few frames, all far behind real time
    sched.add(audio_sequence("new", 1.0))
    first = next(i for i in range(10) if "new" in timed_step(sched, now=1.0 + 0.1 * i))
    assert first <= 1  # c and one of a, b, whose deadlines came before its arrival, go first
    assert all(seq.playback.runs_out_at < 1.3 for seq in late)  # they were late all along
