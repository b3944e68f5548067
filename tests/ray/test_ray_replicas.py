"""Stage replicas on the two-node test cluster (conftest.py): `runtime: ray` with
`num_replicas: 2` runs two Ray actors (each with the stage's `ray_resources`); when one is
killed, the requests it held that had sent no output are re-run on the other, the stage
stays healthy, and the dead actor is rebuilt."""

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
    config = StageDeployConfig(runtime="ray", num_replicas=2, ray_address=ray_cluster, ray_resources={"CPU": 1},
                               restart_backoff_s=0.3)
    orch = Orchestrator(DRAW, "m", {0: config},
                        engine_factory=functools.partial(FakeEngine, num_steps=20, step_delay=0.01))
    orch.start()
    got = Collector()
    try:
        handle = orch.handles[0]
        pids = {replica.endpoint.pid for replica in handle.replicas}
        assert len(pids) == 2 and os.getpid() not in pids
        rids = [f"r{i}" for i in range(8)]
        for rid in rids:
            orch.submit(OmniRequest(rid, f"cat {rid}"), got.sink(rid))
        victim = handle.replicas[0]
        deadline = time.monotonic() + 30
        while len(victim.held) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(victim.endpoint.pid, signal.SIGKILL)
        outs = [got.wait(rid) for rid in rids]
        assert all(out.error is None and out.images for out in outs), [out.error for out in outs]
        assert handle.num_reruns >= 2 and orch.check_health()
    finally:
        orch.close()
        ray.cloudpickle.unregister_pickle_by_value(fake_engines)
