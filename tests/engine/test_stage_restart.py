"""Self-healing stages: a stage whose process died, or whose inline engine lost a worker,
fails its requests as "unavailable", turns unhealthy, is rebuilt with backoff, and serves
again; with restarts off, or when every attempt fails, it stays down."""

from __future__ import annotations

import functools
import threading
import time

from fake_engines import FakeEngine
from test_process_stages import SPEC, Collector

from omnistage.config import StageDeployConfig
from omnistage.core.errors import ErrorKind
from omnistage.engine.orchestrator import OmniRequest, Orchestrator
from omnistage.engine.restart import NO_RESTART, RestartPolicy

FAST = RestartPolicy(max_attempts=3, backoff_s=0.05)


def start(configs, factory=FakeEngine, policy=FAST) -> Orchestrator:
    orch = Orchestrator(SPEC, "m", configs, engine_factory=factory, restart_policy=policy)
    orch.start()
    return orch


def wait_until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_dead_stage_process_fails_as_unavailable_restarts_and_serves_again():
    orch = start({1: StageDeployConfig(runtime="process")},
                 functools.partial(FakeEngine, num_steps=50, step_delay=0.01))
    got = Collector()
    try:
        orch.submit(OmniRequest("slow", "slow"), got.sink("slow"))
        orch.submit(OmniRequest("boom", "crash:drawer"), got.sink("boom"))
        boom, slow = got.wait("boom"), got.wait("slow")
        for out in (boom, slow):  # the crash took the request beside it down too
            assert out.error_kind == ErrorKind.UNAVAILABLE and "stage process died" in out.error, out.error
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


def test_an_inline_engine_that_turns_unhealthy_is_rebuilt():
    built = []

    def factory(model_path, stage, config):
        engine = FakeEngine(model_path, stage, config)
        built.append((stage.id, engine))
        return engine

    orch = start({}, factory)
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


def test_a_process_stage_whose_engine_turns_unhealthy_exits_and_is_rebuilt():
    """A stage process whose engine lost a worker cannot heal itself: it says why and exits."""
    orch = start({1: StageDeployConfig(runtime="process")})
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


def test_restarts_are_bounded_and_off_with_no_restart():
    attempts = []
    healthy_once = threading.Event()

    def factory(model_path, stage, config):
        if stage.id == 1 and healthy_once.is_set():
            attempts.append(time.monotonic())
            raise OSError("the device is gone")
        return FakeEngine(model_path, stage, config)

    orch = start({}, factory, RestartPolicy(max_attempts=3, backoff_s=0.05))
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

    orch = start({}, FakeEngine, NO_RESTART)
    try:
        orch.submit(OmniRequest("boom", "die:drawer"), got.sink("boom2"))
        got.wait("boom2")
        time.sleep(0.2)
        assert not orch.check_health() and orch.handles[1].num_restarts == 0 and orch.handles[1].gave_up
    finally:
        orch.close()
