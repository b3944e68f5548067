"""Autoscaling (`max_replicas`): a replicated stage adds copies under a burst, drains them after
the cool-down (a draining copy takes no new request and finishes its own), never goes below
`min_replicas`, and loses no request on the way."""

from __future__ import annotations

import functools
import threading
import time

import pytest
from engine.fake_engines import Collector, FakeEngine

from omnistage.config import PipelineSpec, StageDeployConfig, StageSpec
from omnistage.engine.autoscaling import AutoscalePolicy, Autoscaler
from omnistage.engine.orchestrator import OmniRequest, Orchestrator

DRAW = PipelineSpec("draw", (StageSpec(0, "drawer", "diffusion", "image", final_output=True),))


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def drawn_by(out) -> int:
    assert out.error is None and out.images, out.error
    return out.images[0].info["pid"]


def test_the_autoscaler_scales_up_at_once_and_down_one_copy_per_cool_down_never_below_min():
    now = [0.0]
    scaler = Autoscaler(AutoscalePolicy(min_replicas=2, max_replicas=5, target_outstanding_per_replica=4,
                                        scale_down_delay_s=10), clock=lambda: now[0])
    assert scaler.decide(9, 2) == 3  # ceil(9 / 4)
    assert scaler.decide(100, 3) == 5  # at most max_replicas
    assert scaler.decide(0, 5) == 5  # less work: wait out the cool-down first
    now[0] = 9.9
    assert scaler.decide(0, 5) == 5
    now[0] = 10
    assert scaler.decide(0, 5) == 4  # one copy...
    now[0] = 15
    assert scaler.decide(0, 4) == 4  # ...and the next one a cool-down later
    now[0] = 20
    assert scaler.decide(0, 4) == 3
    now[0] = 25
    assert scaler.decide(13, 3) == 4  # work came back: the cool-down starts over
    now[0] = 40
    assert scaler.decide(0, 4) == 4
    now[0] = 50
    assert scaler.decide(0, 4) == 3
    now[0] = 60
    assert scaler.decide(0, 3) == 2
    now[0] = 100
    assert scaler.decide(0, 2) == 2  # never below min_replicas


def test_autoscaling_fields_are_checked_naming_them():
    with pytest.raises(ValueError, match="min_replicas <= num_replicas <= max_replicas, got min_replicas=1, "
                                         "num_replicas=3, max_replicas=2"):
        StageDeployConfig(runtime="process", num_replicas=3, max_replicas=2)
    with pytest.raises(ValueError, match="min_replicas=2 needs max_replicas"):
        StageDeployConfig(runtime="process", num_replicas=2, min_replicas=2)
    with pytest.raises(ValueError, match="max_replicas=2 .autoscaling. needs runtime 'process' or 'ray', got runtime 'inline'"):
        StageDeployConfig(max_replicas=2)
    with pytest.raises(ValueError, match="target_outstanding_per_replica: must be > 0"):
        StageDeployConfig(runtime="process", max_replicas=2, target_outstanding_per_replica=0)


def test_a_burst_adds_copies_idle_drains_them_to_min_and_no_request_is_lost():
    # One copy, up to three, aiming at 2 requests per copy. A "linger" request takes 100 steps
    # (about 2 s), a plain one 10. Each copy runs on its own device list.
    lists = (("cuda:0",), ("cuda:1",), ("cuda:2",))
    config = StageDeployConfig(runtime="process", num_replicas=1, max_replicas=3, target_outstanding_per_replica=2,
                               scale_down_delay_s=1.0, replica_devices=lists)
    orch = Orchestrator(DRAW, "m", {0: config}, engine_factory=functools.partial(FakeEngine, num_steps=10,
                                                                                 step_delay=0.02))
    orch.start()
    handle, got, most = orch.handles[0], Collector(), [1]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            most[0] = max(most[0], len(handle.replicas) + handle.num_starting)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        first_pid = handle.replicas[0].endpoint.pid
        # 1. A burst of six on one copy wants three: two copies start and join.
        for i in range(6):
            orch.submit(OmniRequest(f"b{i}", f"linger {i}"), got.sink(f"b{i}"))
        wait_until(lambda: len(handle.replicas) == 3)
        assert handle.num_scale_ups == 2
        assert {drawn_by(got.wait(f"b{i}")) for i in range(6)} == {first_pid}  # routed before the others joined
        # 2. Three more spread over the three copies; three outstanding want two copies, so after the
        # cool-down the newest drains while it still runs its request.
        for i in range(3):
            orch.submit(OmniRequest(f"w{i}", f"linger wave {i}"), got.sink(f"w{i}"))
        wait_until(lambda: handle.draining)
        [drained] = handle.draining
        drained_pid = drained.endpoint.pid
        [held] = drained.held
        # A request arriving now goes to a copy that is not draining.
        orch.submit(OmniRequest("late", "late"), got.sink("late"))
        assert drawn_by(got.wait("late")) != drained_pid
        pids = {drawn_by(got.wait(f"w{i}")) for i in range(3)}
        assert len(pids) == 3 and drawn_by(got.wait(held)) == drained_pid  # it finished its own
        # The copies added later took the lists the first copy left free.
        assert {tuple(got.wait(f"w{i}").images[0].info["devices"]) for i in range(3)} == set(lists)
        # 3. Idle: one copy per cool-down leaves, down to min_replicas (1), not below.
        wait_until(lambda: len(handle.replicas) == 1 and not handle.draining)
        time.sleep(1.2)
        assert len(handle.replicas) == 1 and handle.num_scale_downs == 2
        assert drawn_by(orch_run(orch, got, "after")) in {r.endpoint.pid for r in handle.replicas}
    finally:
        stop.set()
        watcher.join()
        orch.close()
    assert most[0] == 3  # never above max_replicas


def orch_run(orch: Orchestrator, got: Collector, rid: str):
    orch.submit(OmniRequest(rid, rid), got.sink(rid))
    return got.wait(rid)
