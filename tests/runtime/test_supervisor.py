"""Supervised stages: a stage whose process died, hung, or whose engine lost a worker or
panicked, fails what it held as "unavailable", turns unhealthy, is rebuilt with backoff (as
its deploy fields say), and serves again; with restarts off, or when every attempt fails,
it stays down; a request that crashed the stage twice is refused."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

from engine.fake_engines import SPEC, Collector, FakeEngine

from omnistage.config import StageDeployConfig
from omnistage.core.errors import ErrorKind
from omnistage.engine.orchestrator import OmniRequest, Orchestrator

FAST = {"max_restarts": 3, "restart_backoff_s": 0.05}
INLINE = StageDeployConfig(**FAST)
PROCESS = StageDeployConfig(runtime="process", **FAST)


def start(configs, factory=FakeEngine) -> Orchestrator:
    orch = Orchestrator(SPEC, "m", configs, engine_factory=factory)
    orch.start()
    return orch


def wait_until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_dead_stage_process_fails_as_unavailable_restarts_and_serves_again():
    orch = start({0: INLINE, 1: PROCESS}, functools.partial(FakeEngine, num_steps=50, step_delay=0.01))
    got = Collector()
    try:
        orch.submit(OmniRequest("slow", "slow"), got.sink("slow"))
        orch.submit(OmniRequest("boom", "crash:drawer"), got.sink("boom"))
        boom, slow = got.wait("boom"), got.wait("slow")
        for out in (boom, slow):  # the crash took the request beside it down too
            assert out.error_kind == ErrorKind.UNAVAILABLE and "stage process died (exit code 3)" in out.error, out.error
        assert not orch.check_health()
        orch.submit(OmniRequest("during", "x"), got.sink("during"))
        during = got.wait("during")
        assert during.error_kind == ErrorKind.UNAVAILABLE and "restarting" in during.error
        wait_until(orch.check_health)
        assert orch.handles[1].num_restarts == 1
        orch.submit(OmniRequest("after", "x"), got.sink("after"))
        after = got.wait("after")
        assert after.error is None and after.images
    finally:
        orch.close()


def test_a_stage_killed_three_times_in_a_row_comes_back_and_no_queued_request_is_lost():
    orch = start({0: INLINE, 1: PROCESS}, functools.partial(FakeEngine, num_steps=20, step_delay=0.01))
    got = Collector()
    answered: dict[str, object] = {}
    try:
        for kill in range(3):
            wait_until(orch.check_health)
            victim = orch.handles[1].endpoint.pid
            os.kill(victim, signal.SIGKILL)
            # Requests keep coming while the stage is dead and restarting.
            for i in range(5):
                rid = f"k{kill}-{i}"
                orch.submit(OmniRequest(rid, "x"), got.sink(rid))
                time.sleep(0.02)
            for i in range(5):
                answered[f"k{kill}-{i}"] = got.wait(f"k{kill}-{i}")
        wait_until(orch.check_health)
        assert orch.handles[1].num_restarts == 3
        assert len(answered) == 15
        for rid, out in answered.items():  # each one answered: served, or unavailable (a 503 with Retry-After)
            assert out.finished and (out.error is None and out.images or out.error_kind == ErrorKind.UNAVAILABLE), (rid, out)
        assert any(out.error_kind == ErrorKind.UNAVAILABLE for out in answered.values())
        orch.submit(OmniRequest("after", "x"), got.sink("after"))
        assert got.wait("after").images
    finally:
        orch.close()


def test_a_stopped_stage_process_is_detected_as_hung_and_restarted():
    config = StageDeployConfig(runtime="process", stage_timeout_s=1.5, **FAST)
    orch = start({0: INLINE, 1: config}, functools.partial(FakeEngine, num_steps=1000, step_delay=0.01))
    got = Collector()
    try:
        orch.submit(OmniRequest("slow", "slow"), got.sink("slow"))
        wait_until(lambda: any(o.progress for o in got.outputs["slow"]))
        victim = orch.handles[1].endpoint.pid
        os.kill(victim, signal.SIGSTOP)
        stopped = time.monotonic()
        wait_until(lambda: not orch.check_health(), timeout=10)
        assert time.monotonic() - stopped >= 1.4
        slow = got.wait("slow", timeout=10)
        assert slow.error_kind == ErrorKind.UNAVAILABLE and "hung" in slow.error
        wait_until(orch.check_health)
        assert orch.handles[1].endpoint.pid != victim
        orch.submit(OmniRequest("after", "x"), got.sink("after"))
        assert got.wait("after").images
        wait_until(lambda: not os.path.exists(f"/proc/{victim}") or "Z" in open(f"/proc/{victim}/stat").read().split()[2],
                   timeout=20)  # the stopped process was killed, not left behind
    finally:
        orch.close()


def test_an_inline_engine_that_turns_unhealthy_is_rebuilt():
    built = []

    def factory(model_path, stage, config):
        engine = FakeEngine(model_path, stage, config)
        built.append((stage.id, engine))
        return engine

    orch = start({0: INLINE, 1: INLINE}, factory)
    got = Collector()
    try:
        orch.submit(OmniRequest("boom", "die:drawer"), got.sink("boom"))
        boom = got.wait("boom")
        assert boom.error_kind == ErrorKind.UNAVAILABLE and "a worker died" in boom.error
        wait_until(orch.check_health)
        first, second = [engine for stage_id, engine in built if stage_id == 1]
        assert first.closed and not second.closed
        orch.submit(OmniRequest("after", "x"), got.sink("after"))
        assert got.wait("after").error is None
    finally:
        orch.close()


def test_an_inline_engine_that_panics_fails_that_request_and_is_rebuilt():
    orch = start({0: INLINE, 1: INLINE})
    got = Collector()
    try:
        orch.submit(OmniRequest("boom", "panic:drawer"), got.sink("boom"))
        boom = got.wait("boom")
        assert boom.error_kind == ErrorKind.UNAVAILABLE
        assert "the engine panicked: PanicException: capacity overflow, while running this request" in boom.error
        wait_until(orch.check_health)
        assert orch.fatal_error is None  # the orchestrator's loop lives on
        orch.submit(OmniRequest("after", "x"), got.sink("after"))
        assert got.wait("after").images
    finally:
        orch.close()


def test_a_request_that_crashed_the_stage_twice_is_refused():
    orch = start({0: INLINE, 1: INLINE})
    got = Collector()
    try:
        for attempt in range(2):
            rid = f"poison{attempt}"
            orch.submit(OmniRequest(rid, "panic:drawer"), got.sink(rid))
            assert got.wait(rid).error_kind == ErrorKind.UNAVAILABLE
            wait_until(orch.check_health)
        orch.submit(OmniRequest("again", "panic:drawer"), got.sink("again"))
        again = got.wait("again")
        assert again.error_kind == ErrorKind.INVALID_REQUEST and "crashed the stage 2 times" in again.error
        assert orch.handles[1].num_restarts == 2 and orch.check_health()  # refused, not run: no third crash
        orch.submit(OmniRequest("other", "x"), got.sink("other"))
        assert got.wait("other").images
    finally:
        orch.close()


def test_a_process_stage_whose_engine_turns_unhealthy_exits_and_is_rebuilt():
    """A stage process whose engine lost a worker cannot heal itself: it says why and exits."""
    orch = start({0: INLINE, 1: PROCESS})
    got = Collector()
    try:
        orch.submit(OmniRequest("boom", "die:drawer"), got.sink("boom"))
        boom = got.wait("boom")
        assert boom.error_kind == ErrorKind.UNAVAILABLE and "a worker died" in boom.error
        wait_until(orch.check_health)
        orch.submit(OmniRequest("after", "x"), got.sink("after"))
        assert got.wait("after").error is None
    finally:
        orch.close()


def test_restarts_are_bounded_and_off_with_max_restarts_0():
    attempts = []
    healthy_once = threading.Event()

    def factory(model_path, stage, config):
        if stage.id == 1 and healthy_once.is_set():
            attempts.append(time.monotonic())
            raise OSError("the device is gone")
        return FakeEngine(model_path, stage, config)

    orch = start({0: INLINE, 1: INLINE}, factory)
    healthy_once.set()
    got = Collector()
    try:
        orch.submit(OmniRequest("boom", "die:drawer"), got.sink("boom"))
        got.wait("boom")
        wait_until(lambda: orch.handles[1].gave_up)
        assert len(attempts) == 3
        gaps = [b - a for a, b in zip(attempts, attempts[1:])]
        assert gaps[1] > gaps[0] * 1.5, gaps  # the backoff doubles
        assert not orch.check_health()
        orch.submit(OmniRequest("later", "x"), got.sink("later"))
        later = got.wait("later")
        assert later.error_kind == ErrorKind.UNAVAILABLE and "could not be restarted" in later.error
    finally:
        orch.close()

    orch = start({1: StageDeployConfig(max_restarts=0)}, FakeEngine)
    try:
        orch.submit(OmniRequest("boom", "die:drawer"), got.sink("boom2"))
        got.wait("boom2")
        time.sleep(0.2)
        assert not orch.check_health() and orch.handles[1].num_restarts == 0 and orch.handles[1].gave_up
    finally:
        orch.close()


class ThreadEngine(FakeEngine):
    def thread_name(self) -> str:
        return threading.current_thread().name


def test_control_calls_reach_an_inline_engine_on_the_loops_thread():
    orch = start({0: INLINE, 1: INLINE}, ThreadEngine)
    try:  # never on the caller's thread, beside a step
        assert orch.handles[1].call("thread_name").result(timeout=10) == "omnistage-orchestrator"
    finally:
        orch.close()


def test_control_calls_reach_the_engine_in_its_process_and_fail_when_it_dies():
    orch = start({0: INLINE, 1: PROCESS})
    try:
        replied = orch.handles[1].call("has_unfinished_requests")  # answered on the loop's thread
        assert replied.result(timeout=30) is False
        failed = orch.handles[1].call("no_such_method")
        assert "AttributeError" in str(failed.exception(timeout=30))
        os.kill(orch.handles[1].endpoint.pid, signal.SIGSTOP)  # a reply that never comes...
        pending = orch.handles[1].call("has_unfinished_requests")
        os.kill(orch.handles[1].endpoint.pid, signal.SIGKILL)  # ...fails when the stage dies
        assert "stage process died" in str(pending.exception(timeout=30))
    finally:
        orch.close()
