"""Stage replicas on the two-node test cluster (conftest.py): `runtime: ray` with
`num_replicas: 2` and `ray_placement_strategy: SPREAD` runs two Ray actors, one per node, in
one placement group; when one is killed, the requests it held that had sent no output are
re-run on the other, the stage stays healthy, the dead actor is rebuilt in its own bundle
(on the same node), and closing removes the placement group."""

from __future__ import annotations

import functools
import os
import signal
import time

import pytest
from engine import fake_engines
from engine.fake_engines import Collector, FakeEngine

from omnistage.config import PipelineSpec, StageDeployConfig, StageSpec
from omnistage.engine.orchestrator import OmniRequest, Orchestrator

pytestmark = pytest.mark.slow

DRAW = PipelineSpec("draw", (StageSpec(0, "drawer", "diffusion", "image", final_output=True),))


def test_ray_replicas_are_actors_and_a_killed_one_fails_over(ray_cluster):
    import ray

    # The actors import the fake engine from this test tree, which is not on their path.
    ray.cloudpickle.register_pickle_by_value(fake_engines)
    lists = (("cpu:0",), ("cpu:1",))  # each copy's own devices (CPU ones: Ray leaves them as they are)
    config = StageDeployConfig(runtime="ray", num_replicas=2, ray_address=ray_cluster, ray_resources={"CPU": 1},
                               ray_placement_strategy="SPREAD", restart_backoff_s=0.3, replica_devices=lists)
    orch = Orchestrator(DRAW, "m", {0: config},
                        engine_factory=functools.partial(FakeEngine, num_steps=20, step_delay=0.01))
    orch.start()
    got = Collector()
    try:
        handle = orch.handles[0]
        pids = {replica.endpoint.pid for replica in handle.replicas}
        assert len(pids) == 2 and os.getpid() not in pids
        nodes = [replica.endpoint.node_id for replica in handle.replicas]
        assert len(set(nodes)) == 2, "SPREAD put both copies on one node"
        rids = [f"r{i}" for i in range(8)]
        for rid in rids:
            orch.submit(OmniRequest(rid, f"cat {rid}"), got.sink(rid))
        victim = handle.replicas[0]
        first_pids = [replica.endpoint.pid for replica in handle.replicas]
        deadline = time.monotonic() + 30
        while len(victim.held) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(victim.endpoint.pid, signal.SIGKILL)
        outs = [got.wait(rid) for rid in rids]
        assert all(out.error is None and out.images for out in outs), [out.error for out in outs]
        # Each copy's engine ran on its own list (the killed copy's first process drew what it finished).
        drawn = [out.images[0].info for out in outs]
        assert {(info["pid"], tuple(info["devices"])) for info in drawn if info["pid"] in first_pids} <= {
            (pid, lists[i]) for i, pid in enumerate(first_pids)}
        assert any(info["pid"] == first_pids[1] for info in drawn)
        assert handle.num_reruns >= 2 and orch.check_health()
        while not victim.is_healthy():
            assert time.monotonic() < deadline + 60, "the killed copy was not rebuilt"
            time.sleep(0.05)
        assert [replica.endpoint.node_id for replica in handle.replicas] == nodes  # back in its bundle
    finally:
        orch.close()
        ray.cloudpickle.unregister_pickle_by_value(fake_engines)
    from ray.util import placement_group_table

    assert all(group["state"] == "REMOVED" for group in placement_group_table().values())


def test_ray_autoscaling_adds_an_actor_in_a_group_of_its_own_and_removes_the_group_when_it_drains(ray_cluster):
    import ray
    from ray.util import placement_group_table

    def live_groups() -> int:
        return sum(group["state"] == "CREATED" for group in placement_group_table().values())

    ray.cloudpickle.register_pickle_by_value(fake_engines)
    config = StageDeployConfig(runtime="ray", num_replicas=1, max_replicas=2, target_outstanding_per_replica=1,
                               scale_down_delay_s=0.5, ray_address=ray_cluster, ray_resources={"CPU": 1})
    # A "linger" request takes 200 steps of 10 ms: the burst outlasts the second actor's start.
    orch = Orchestrator(DRAW, "m", {0: config},
                        engine_factory=functools.partial(FakeEngine, num_steps=20, step_delay=0.01))
    orch.start()
    got = Collector()
    try:
        handle = orch.handles[0]
        assert live_groups() == 1
        for i in range(4):
            orch.submit(OmniRequest(f"b{i}", f"linger {i}"), got.sink(f"b{i}"))
        deadline = time.monotonic() + 60
        while len(handle.replicas) < 2:
            assert time.monotonic() < deadline, "no second actor joined"
            time.sleep(0.02)
        assert handle.num_scale_ups == 1 and live_groups() == 2  # the start group and the new copy's own
        pids = {replica.endpoint.pid for replica in handle.replicas}
        assert len(pids) == 2 and os.getpid() not in pids
        orch.submit(OmniRequest("late", "late"), got.sink("late"))  # the new actor serves
        outs = [got.wait(rid) for rid in [f"b{i}" for i in range(4)] + ["late"]]
        assert all(out.error is None and out.images for out in outs), [out.error for out in outs]
        while len(handle.replicas) > 1 or live_groups() > 1:  # idle: the added copy drains, its group goes
            assert time.monotonic() < deadline + 30, "the added copy did not drain"
            time.sleep(0.05)
        assert handle.num_scale_downs == 1
    finally:
        orch.close()
        ray.cloudpickle.unregister_pickle_by_value(fake_engines)
    assert live_groups() == 0
