"""Stage handles: how the orchestrator reaches a stage, picked once from its deploy `runtime`.

Every stage is a `runtime.Supervisor` (which tracks the requests it holds and rebuilds it
when it dies or hangs) over an endpoint:

- "inline": `InlineEndpoint`; the engine steps in the orchestrator's thread.
- "process": `ProcessEndpoint`; the engine runs in a spawned child (a script that starts
  process stages needs the `if __name__ == "__main__":` guard), payloads through the
  pipeline's channel transport.
- "ray": `RayEndpoint`; the engine runs in a Ray actor on a node with its `ray_resources`.

The restart policy and the hang timeout come from the stage's deploy fields
(`max_restarts`, `restart_backoff_s`, `stage_timeout_s`). A stage with `num_replicas` > 1
is a `ReplicaSet` (replicas.py) of that many supervisors, one endpoint each, routed by its
`routing_policy`; one with `max_replicas` is a `ReplicaSet` whose `Autoscaler` (autoscaling.py)
adds and drains copies. With `replica_devices` each copy holds one device list (`DeviceLists`)
and its engine gets it as its `devices`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from omnistage.engine.autoscaling import AutoscalePolicy, Autoscaler
from omnistage.engine.replicas import ReplicaSet
from omnistage.engine.routing import make_policy
from omnistage.runtime.channel import DEFAULT_THRESHOLD_BYTES, Channel
from omnistage.runtime.endpoint import Endpoint, InlineEndpoint, ProcessEndpoint
from omnistage.runtime.supervisor import RestartPolicy, Supervisor

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.config.spec import StageSpec
    from omnistage.engine.factory import EngineFactory

StageHandle = Supervisor | ReplicaSet


@dataclass(frozen=True)
class EngineBuilder:
    """Builds a stage's engine where it runs; picklable, so process and Ray stages get it."""

    factory: EngineFactory
    model_path: str
    stage_fields: dict[str, Any]
    config: StageDeployConfig
    in_child: bool = False

    def __call__(self) -> Any:
        from omnistage.config.spec import StageSpec

        if self.in_child:  # the stage's `env` is process plumbing for its own process only
            os.environ.update(self.config.env)
        return self.factory(self.model_path, StageSpec(**self.stage_fields), self.config)


def restart_policy(config: StageDeployConfig) -> RestartPolicy:
    return RestartPolicy(max_restarts=config.max_restarts, backoff_s=config.restart_backoff_s,
                         stage_timeout_s=config.stage_timeout_s)


def make_stage_handle(
    stage: StageSpec,
    config: StageDeployConfig,
    model_path: str,
    factory: EngineFactory,
    connector: str = "shm",
    threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
    shm_prefix: str = "omni",
) -> StageHandle:
    """The supervised stage for `config.runtime` (a replica set with `num_replicas` > 1); a
    process stage's segments are named `{shm_prefix}r{generation}{p|c}N`, its replica i's
    `{shm_prefix}x{i}r{generation}{p|c}N`."""
    if config.runtime == "process" and connector == "ray":
        raise ValueError(f"stage {stage.label}: connector 'ray' carries the payloads of runtime 'ray' stages; "
                         f"this stage has runtime 'process': give it runtime 'ray', or use connector 'shm'")
    if config.runtime not in ("inline", "process", "ray"):
        raise ValueError(f"stage {stage.label}: unknown runtime {config.runtime!r}")
    build = EngineBuilder(factory, model_path, portable_stage_fields(stage), config, in_child=True)

    def endpoint(generation: int, replica: int | None = None, placement: tuple[Any, int] | None = None,
                 devices: tuple[str, ...] | None = None) -> Endpoint:
        # A copy with its own device list (replica_devices) runs a config whose devices are that list.
        own = config if devices is None else dataclasses.replace(config, devices=devices, replica_devices=())
        if config.runtime == "inline":
            return InlineEndpoint(lambda: factory(model_path, stage, config))
        if config.runtime == "process":
            prefix = f"{shm_prefix}r{generation}" if replica is None else f"{shm_prefix}x{replica}r{generation}"
            return ProcessEndpoint(stage.label, dataclasses.replace(build, config=own),
                                   Channel(connector, f"{prefix}p", threshold_bytes),
                                   Channel(connector, f"{prefix}c", threshold_bytes))
        from omnistage.runtime import ray as ray_runtime  # Ray is optional

        # Shared memory does not cross machines: a Ray stage takes `shm` as Ray's own transport.
        channel = Channel("ray" if connector == "ray" else "inline", "", threshold_bytes, config.ray_address)
        gpu = _ray_wants_gpu(config)
        # Ray makes the GPUs it gives the actor visible from cuda:0 on: the engine sees them so.
        seen = ray_runtime.devices_in_actor(own.devices, own.num_devices, gpu)
        actor_build = dataclasses.replace(build, config=dataclasses.replace(own, devices=seen))
        return ray_runtime.RayEndpoint(stage.label, actor_build, channel, own, gpu, placement)

    if config.num_replicas == 1 and config.max_replicas is None:
        return Supervisor(stage.label, endpoint, restart_policy(config))
    bundles = None  # with Ray: the placement bundles the copies run in (one per copy)
    if config.runtime == "ray":
        from omnistage.runtime import ray as ray_runtime

        bundles = ray_runtime.BundlePool(config, _ray_wants_gpu(config), f"stage {stage.label}: num_replicas")
    device_lists = DeviceLists(stage.label, config.replica_devices) if config.replica_devices else None
    crashes: dict[str, int] = {}  # shared: a request that crashed one copy counts against all

    def make_replica(i: int) -> Supervisor:
        label = f"{stage.label}[{i}]"
        slot = None if device_lists is None else device_lists.take()
        placement = None

        def give_back() -> None:  # the copy's device list and bundle, once it stopped
            if slot is not None:
                device_lists.give_back(slot)
            if placement is not None:
                bundles.give_back(placement)

        try:
            placement = None if bundles is None else bundles.take()
            devices = None if slot is None else config.replica_devices[slot]
            return Supervisor(label, functools.partial(endpoint, replica=i, placement=placement, devices=devices),
                              restart_policy(config), crashes, on_close=give_back)
        except BaseException:
            give_back()
            raise

    replicas: list[Supervisor] = []
    try:
        for i in range(config.num_replicas):
            replicas.append(make_replica(i))
    except BaseException:
        for replica in replicas:
            replica.close()
        if bundles is not None:
            bundles.close()
        raise
    autoscaler = None
    if config.max_replicas is not None:
        autoscaler = Autoscaler(AutoscalePolicy(config.min_replicas, config.max_replicas,
                                                config.target_outstanding_per_replica, config.scale_down_delay_s))
    return ReplicaSet(stage.label, replicas, make_policy(config.routing_policy),
                      on_close=None if bundles is None else bundles.close, make_replica=make_replica,
                      autoscaler=autoscaler)


class DeviceLists:
    """The `replica_devices` lists of a stage that no running copy holds. A copy takes the first
    free one (the copies a stage starts with take list 0, 1, ... in order) and gives it back when
    it stops; its rebuilds keep it. A copy added by autoscaling while every list is held (the copy
    it replaces still stopping) fails to start, and the scaler tries again later."""

    def __init__(self, label: str, lists: tuple[tuple[str, ...], ...]):
        self.label = label
        self.lists = lists
        self._free = list(range(len(lists)))
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            if not self._free:
                raise RuntimeError(f"stage {self.label}: all {len(self.lists)} replica_devices lists are held by "
                                   f"running copies")
            return self._free.pop(0)

    def give_back(self, slot: int) -> None:
        with self._lock:
            self._free = sorted(self._free + [slot])


def _ray_wants_gpu(config: StageDeployConfig) -> bool:
    from omnistage.runtime import ray as ray_runtime

    cluster = ray_runtime.joined(config.ray_address)
    devices = config.devices or tuple(d for copy in config.replica_devices for d in copy)
    return ray_runtime.wants_gpu(devices, cluster.cluster_resources().get("GPU", 0))


def portable_stage_fields(stage: StageSpec) -> dict[str, Any]:
    """StageSpec fields that can be pickled to a stage process.

    Processors stay behind (the orchestrator runs them, and lambdas do not pickle), and
    the read-only mappings become plain dicts (mappingproxy does not pickle).
    """
    values = {f.name: getattr(stage, f.name) for f in fields(stage)}
    values.update(input_processor=None, chunk_processor=None, defaults=dict(stage.defaults), hard=dict(stage.hard))
    return values
