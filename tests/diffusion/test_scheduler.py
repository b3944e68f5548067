"""The diffusion schedulers, driven directly with a fake clock and hand-built runner outputs."""

from __future__ import annotations

import dataclasses

import pytest

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.diffusion.sched import (
    EngineRequest,
    RequestScheduler,
    RequestStatus,
    RunnerOutput,
    SchedulerOutput,
    StepScheduler,
)
from omnistage.core.types import ImagePayload, ProgressPayload


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_request(rid: str, key="a", steps: int = 2, at: float = 100.0) -> EngineRequest:
    params = DiffusionParams(num_inference_steps=steps, seed=0)
    return EngineRequest(DiffusionRequest(rid, "p", params), key, arrival_time=at, num_steps=steps)


def ids(batch: SchedulerOutput) -> list[str]:
    return batch.req_ids


class FakeRunner:
    """Advances every request of a batch by one step, as the real runner does in both modes."""

    def __init__(self):
        self.steps: dict[str, tuple[int, int]] = {}  # rid -> (done, total)
        self.freed: set[str] = set()

    def execute(self, batch: SchedulerOutput, fail: set[str] = frozenset()) -> RunnerOutput:
        for rid in batch.finished_req_ids:
            self.freed.add(rid)
            self.steps.pop(rid, None)
        for r in batch.new_requests:
            self.steps[r.request_id] = (0, r.params.num_inference_steps)
        out = RunnerOutput()
        for rid in batch.req_ids:
            if rid in fail:
                out.errors[rid] = "boom"
                self.steps.pop(rid)
                continue
            done, total = self.steps[rid]
            done += 1
            out.progress.append((rid, ProgressPayload(done, total)))
            self.steps[rid] = (done, total)
            if done == total:
                out.payloads[rid] = ImagePayload([])
                del self.steps[rid]
        return out


def run_batch(s, runner: FakeRunner) -> list[str]:
    """Run one batch (one step) to the end of its batch: the admitted request ids."""
    batch = s.schedule()
    s.update(batch, runner.execute(batch))
    return [r.request_id for r in batch.new_requests]


def admissions(s, runner: FakeRunner, max_batches: int = 100) -> list[list[str]]:
    """Step until idle; the joiners of every batch that admitted some."""
    joined = []
    for _ in range(max_batches):
        if not s.has_unfinished_requests():
            return joined
        new = run_batch(s, runner)
        if new:
            joined.append(new)
    raise AssertionError("scheduler did not finish")


# -- request mode ----------------------------------------------------------------------------


def test_request_mode_batches_matching_keys_fifo_up_to_max():
    s = RequestScheduler(max_num_seqs=2, clock=Clock())
    for rid, key in [("r0", "a"), ("r1", "b"), ("r2", "a"), ("r3", "a"), ("r4", "b")]:
        s.add_request(make_request(rid, key))
    # The head's key, in arrival order, capped at 2; then the incompatible request heads the queue.
    assert admissions(s, FakeRunner()) == [["r0", "r2"], ["r1", "r4"], ["r3"]]
    assert s.schedule().is_empty


@pytest.mark.parametrize("cls", [RequestScheduler, StepScheduler])
def test_a_request_made_before_the_waiting_ones_is_queued_ahead_of_them(cls):
    # A re-run (its replica died) arrives after newer work but was made before it: it waits behind
    # only what was made earlier. Made at 1, 3, 4 and arriving in that order, then the re-run made at 2.
    s = cls(max_num_seqs=1, clock=Clock())
    for rid, made in [("r1", 1.0), ("r3", 3.0), ("r4", 4.0), ("rerun", 2.0)]:
        s.add_request(dataclasses.replace(make_request(rid), submitted_time=made))
    s.add_request(make_request("untimed"))  # no orchestrator time: it joins the end
    assert [r.request_id for r in s.waiting] == ["r1", "rerun", "r3", "r4", "untimed"]


def test_request_mode_runs_a_batch_step_by_step_without_joiners():
    s, runner = RequestScheduler(max_num_seqs=4, clock=Clock()), FakeRunner()
    s.add_request(make_request("r0", steps=3))
    s.add_request(make_request("short", steps=1))
    assert run_batch(s, runner) == ["r0", "short"]
    s.add_request(make_request("late", steps=1))
    batch = s.schedule()  # "short" finished, "late" waits: no joins while the batch runs
    assert ids(batch) == ["r0"] and not batch.new_requests
    s.update(batch, runner.execute(batch))
    assert run_batch(s, runner) == []
    assert run_batch(s, runner) == ["late"]


def test_request_mode_update_finishes_and_fails_and_records_metrics():
    clock = Clock()
    s, runner = RequestScheduler(max_num_seqs=4, clock=clock), FakeRunner()
    for rid in ("r0", "r1", "r2"):
        s.add_request(make_request(rid, steps=3))
    clock.now = 101.0
    batch = s.schedule()
    assert len(batch.new_requests) == 3
    out = runner.execute(batch, fail={"r1"})
    assert len(out.progress) == 2  # one step for each surviving request
    failed = s.update(batch, out)
    assert [(r.request_id, r.status) for r in failed] == [("r1", RequestStatus.FAILED)]
    finished = {}
    for now in (102.0, 103.0):
        clock.now = now
        batch = s.schedule()
        assert "r1" in batch.finished_req_ids or now == 103.0  # the failed state is freed once
        finished.update({r.request_id: r for r in s.update(batch, runner.execute(batch))})
    r0 = finished["r0"]
    assert r0.status is RequestStatus.FINISHED
    assert (r0.scheduled_time - r0.arrival_time, r0.finish_time - r0.scheduled_time) == (1.0, 2.0)
    assert r0.num_steps_done == 3 and r0.mean_batch_size == pytest.approx(7 / 3)  # 3 in its first step, then 2, 2
    assert not s.has_unfinished_requests()


def test_request_mode_coalesces_a_burst_until_max_wait():
    clock = Clock()
    s = RequestScheduler(max_num_seqs=3, max_wait_ms=50, clock=clock)
    s.add_request(make_request("r0", at=clock.now))
    assert s.schedule().is_empty and s.wait_time() == pytest.approx(0.05)
    clock.now += 0.02
    s.add_request(make_request("r1", at=clock.now))
    assert s.schedule().is_empty  # still not full, head only 20 ms old
    clock.now += 0.031
    assert ids(s.schedule()) == ["r0", "r1"]  # head's wait is over: go with what we have
    s = RequestScheduler(max_num_seqs=3, max_wait_ms=50, clock=clock)
    for i in range(3):
        s.add_request(make_request(f"f{i}", at=clock.now))
    assert ids(s.schedule()) == ["f0", "f1", "f2"]  # a full batch never waits


def test_request_mode_abort_waiting_and_in_flight():
    s = RequestScheduler(max_num_seqs=2, clock=Clock())
    for rid in ("r0", "r1", "r2"):
        s.add_request(make_request(rid))
    assert s.abort_request("r2") and not s.abort_request("nope")
    runner = FakeRunner()
    assert run_batch(s, runner) == ["r0", "r1"]
    s.abort_request("r1")  # running: it leaves before the next step, which frees its state
    batch = s.schedule()
    assert ids(batch) == ["r0"] and batch.finished_req_ids == {"r1"}
    finished = s.update(batch, runner.execute(batch))
    assert [r.request_id for r in finished] == ["r0"] and runner.freed == {"r1"}
    assert not s.has_unfinished_requests()


def test_duplicate_request_id_is_rejected():
    s = RequestScheduler()
    s.add_request(make_request("r0"))
    with pytest.raises(ValueError, match="request_id"):
        s.add_request(make_request("r0"))


@pytest.mark.parametrize("cls", [RequestScheduler, StepScheduler])
def test_bad_limits_name_the_field(cls):
    with pytest.raises(ValueError, match="max_num_seqs"):
        cls(max_num_seqs=0)
    with pytest.raises(ValueError, match="request_batch_max_wait_ms"):
        cls(max_wait_ms=-1)


# -- step mode -------------------------------------------------------------------------------


def run_ticks(s: StepScheduler, runner: FakeRunner, n: int, fail=frozenset()):
    done = []
    for _ in range(n):
        batch = s.schedule()
        done += [r.request_id for r in s.update(batch, runner.execute(batch, fail))]
    return done


def test_step_mode_joins_at_step_boundaries_and_mixes_step_counts():
    s, runner = StepScheduler(max_num_seqs=3, clock=Clock()), FakeRunner()
    s.add_request(make_request("long", steps=4))
    b1 = s.schedule()
    assert [r.request_id for r in b1.new_requests] == ["long"] and b1.running_req_ids == []
    s.update(b1, runner.execute(b1))
    s.add_request(make_request("short", steps=1))
    b2 = s.schedule()
    # the joiner arrives in full, the running one by id only
    assert [r.request_id for r in b2.new_requests] == ["short"] and b2.running_req_ids == ["long"]
    assert [r.request_id for r in s.update(b2, runner.execute(b2))] == ["short"]
    b3 = s.schedule()
    assert b3.new_requests == [] and b3.running_req_ids == ["long"]
    assert [r.request_id for r in s.update(b3, runner.execute(b3))] == []
    assert run_ticks(s, runner, 1) == ["long"]
    assert not s.has_unfinished_requests() and runner.steps == {}


def test_step_mode_caps_running_set_and_admits_fifo_as_slots_free():
    s, runner = StepScheduler(max_num_seqs=2, clock=Clock()), FakeRunner()
    s.add_request(make_request("r0", steps=1))
    s.add_request(make_request("r1", steps=3))
    s.add_request(make_request("r2", steps=1))
    b1 = s.schedule()
    assert b1.req_ids == ["r0", "r1"] and s.num_waiting == 1
    s.update(b1, runner.execute(b1))  # r0 done: a slot frees
    b2 = s.schedule()
    assert b2.req_ids == ["r2", "r1"]


def test_step_mode_abort_frees_state_at_next_boundary():
    s, runner = StepScheduler(max_num_seqs=4, clock=Clock()), FakeRunner()
    s.add_request(make_request("keep", steps=3))
    s.add_request(make_request("drop", steps=3))
    run_ticks(s, runner, 1)
    s.abort_request("drop")
    batch = s.schedule()
    assert batch.finished_req_ids == {"drop"} and batch.running_req_ids == ["keep"]
    s.update(batch, runner.execute(batch))
    assert "drop" in runner.freed
    assert run_ticks(s, runner, 1) == ["keep"]
    # an abort while nothing else runs still reaches the workers
    s.add_request(make_request("late", steps=3))
    run_ticks(s, runner, 1)
    s.abort_request("late")
    batch = s.schedule()
    assert not batch.is_empty and batch.num_reqs == 0 and batch.finished_req_ids == {"late"}


def test_step_mode_failure_retires_request_and_frees_its_state():
    s, runner = StepScheduler(max_num_seqs=4, clock=Clock()), FakeRunner()
    s.add_request(make_request("ok", steps=2))
    s.add_request(make_request("bad", steps=2))
    batch = s.schedule()
    finished = s.update(batch, runner.execute(batch, fail={"bad"}))
    assert [(r.request_id, r.status) for r in finished] == [("bad", RequestStatus.FAILED)]
    assert s.schedule().finished_req_ids == {"bad"}


def test_step_mode_waits_for_a_burst_only_when_idle():
    clock = Clock()
    s, runner = StepScheduler(max_num_seqs=4, max_wait_ms=10, clock=clock), FakeRunner()
    s.add_request(make_request("r0", steps=3, at=clock.now))
    assert s.schedule().is_empty
    clock.now += 0.011
    s.update(b := s.schedule(), runner.execute(b))
    s.add_request(make_request("r1", steps=3, at=clock.now))  # something runs: join at once
    assert s.schedule().req_ids == ["r1", "r0"]


def test_step_mode_records_mean_batch_size_and_fail_all():
    s, runner = StepScheduler(max_num_seqs=4, clock=Clock()), FakeRunner()
    s.add_request(make_request("a", steps=2))
    batch = s.schedule()
    s.update(batch, runner.execute(batch))
    s.add_request(make_request("b", steps=2))
    s.add_request(make_request("c", steps=2))
    finished = run_ticks(s, runner, 1)
    assert finished == ["a"]
    assert s.get_request("b").mean_batch_size == 3
    failed = s.fail_all()
    assert {r.request_id for r in failed} == {"b", "c"} and not s.has_unfinished_requests()
    assert s.schedule().req_ids == []


def test_the_batch_schedulers_import_no_torch():
    """`sched/` is plain Python over request objects (DiffusionRequest lives in request.py)."""
    import subprocess
    import sys

    code = "import sys, omnistage.diffusion.sched; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
