"""Ray, written once: import and join a cluster, actor resources, placement groups, the
description of an actor's death, and `RayEndpoint`, an engine served in a Ray actor.

Used by the Ray stage runtime (`runtime: ray`), the Ray executor
(diffusion/executor/ray.py) and the channel's ray transport. Ray is optional
(`pip install 'omnistage[ray]'`); nothing imports it until a deploy file asks for it.

`StageActor` runs `loop.serve` on a thread of its own while `add`/`abort` calls queue
commands for it. The actor is threaded, so `poll` can wait for events while the loop
computes; as a threaded actor may run calls out of order, the endpoint numbers its
commands and the actor applies them in that order (a streamed chunk never overtakes its
request). On the endpoint's side a poller thread keeps one `poll` in flight (a long poll:
it returns when events are ready, or after `POLL_S`), queues what comes back and wakes
the orchestrator, so `step()` never blocks. An actor that dies is a "died" event.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import TYPE_CHECKING, Any

from omnistage.runtime.channel import Channel
from omnistage.runtime.endpoint import EngineBuilder, Waker, pack_events
from omnistage.runtime.loop import Event, describe, drain, serve

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig

logger = logging.getLogger(__name__)

PROPAGATED_ENV = ("PYTHONPATH",)
"""Variables of this process that every actor gets: on a local cluster `ray start` may have
been run from another shell, and the actors must import the same omnistage."""

PLACEMENT_TIMEOUT_S = 60.0
POLL_S = 1.0
"""Longest a `poll` call waits for events; bounds how long close() waits on the poller."""
CLOSE_TIMEOUT_S = 10.0
def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ImportError("runtime, executor or connector 'ray' needs Ray, which is not installed: "
                          "pip install 'omnistage[ray]'") from e
    return ray


def ensure_ray(address: str | None = None) -> str:
    """Join the Ray cluster at `address` (None: $RAY_ADDRESS, else a running local cluster,
    else a new local one) unless this process already joined one; return its GCS address,
    which another process can join with the same call."""
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or None, include_dashboard=False,
                 runtime_env={"env_vars": propagated_env()}, configure_logging=False)
    return ray.get_runtime_context().gcs_address


def propagated_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The env_vars of an actor's runtime_env: PROPAGATED_ENV from here, then the stage's `env`."""
    env = {name: os.environ[name] for name in PROPAGATED_ENV if os.environ.get(name)}
    env.update(extra or {})
    return env


def runtime_env(stage_env: dict[str, str]) -> dict[str, Any]:
    """The `runtime_env` option of a stage's actor: none when the stage sets no `env` (the job's
    own, from ensure_ray, lets Ray reuse its prestarted workers), else the job's plus the stage's."""
    return {"runtime_env": {"env_vars": propagated_env(stage_env)}} if stage_env else {}


def use_reserved_cpus(config: StageDeployConfig) -> None:
    """Inside an actor: as many torch threads as the CPUs it reserved (`ray_resources` CPU, default
    1), whatever OMP_NUM_THREADS the Ray worker process was started with."""
    import torch

    torch.set_num_threads(max(1, int(config.ray_resources.get("CPU", 1))))


def wants_gpu(devices: tuple[str, ...], cluster_gpus: float) -> bool:
    """Whether a stage's actor asks Ray for a GPU: it lists a CUDA device, or it lists none (the
    platform default) and the cluster has GPUs. The driver's own CUDA does not matter: a Ray
    head often has none."""
    if devices:
        return any(device.startswith("cuda") for device in devices)
    return cluster_gpus > 0


def devices_in_actor(devices: tuple[str, ...], num_devices: int, gpu: bool) -> tuple[str, ...]:
    """The stage's `devices` as its actor sees them: Ray makes the GPUs it assigned visible as
    cuda:0, cuda:1, ... so CUDA devices are renumbered in order of first mention; with none
    listed and a GPU wanted, cuda:0 onwards. CPU entries stay."""
    if not gpu:
        return tuple(devices)
    if not devices:
        return tuple(f"cuda:{i}" for i in range(num_devices))
    order: dict[str, int] = {}
    return tuple(f"cuda:{order.setdefault(d, len(order))}" if d.startswith("cuda") else d for d in devices)


def actor_resources(config: StageDeployConfig, cuda: bool) -> dict[str, Any]:
    """`num_cpus`, `num_gpus` and custom `resources` of one actor of this stage: `ray_resources`
    with CPU 1 (and GPU 1 on CUDA) by default."""
    custom = dict(config.ray_resources)
    return {"num_cpus": custom.pop("CPU", 1.0), "num_gpus": custom.pop("GPU", 1.0 if cuda else 0.0),
            "resources": custom}


def bundle(resources: dict[str, Any]) -> dict[str, float]:
    """The placement-group bundle that holds one actor with `resources` (from actor_resources)."""
    out = {"CPU": resources["num_cpus"], **resources["resources"]}
    if resources["num_gpus"]:
        out["GPU"] = resources["num_gpus"]
    return {name: amount for name, amount in out.items() if amount}


def check_placeable(bundle_: dict[str, float], what: str) -> None:
    """ValueError naming the resources when no live node of the cluster offers all of `bundle_`
    (else Ray would wait for such a node forever)."""
    ray = import_ray()
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    if not any(all(node.get(name, 0) >= amount for name, amount in bundle_.items()) for node in nodes):
        raise ValueError(f"{what}: ray_resources: no node of the Ray cluster offers {bundle_} (its nodes offer "
                         f"{[{k: v for k, v in node.items() if not k.startswith('node:')} for node in nodes]})")


def reserve(bundles: list[dict[str, float]], strategy: str, what: str, timeout_s: float = PLACEMENT_TIMEOUT_S) -> Any:
    """A ready placement group of `bundles`; RuntimeError naming what the cluster lacks when it
    cannot be placed within `timeout_s`."""
    ray = import_ray()
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group(bundles, strategy=strategy)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except Exception as e:
        remove_placement_group(group)
        if isinstance(e, ray.exceptions.GetTimeoutError):
            raise RuntimeError(f"{what}: Ray cannot place {bundles} ({strategy}) within {timeout_s:.0f} s; the "
                               f"cluster has {ray.cluster_resources()} (set ray_resources to what its nodes "
                               f"offer)") from None
        raise
    return group


class BundlePool:
    """The placement bundles of a stage's copies. At start one placement group holds a bundle of the
    stage's actor resources per copy (`num_replicas`), spread over the nodes as
    `ray_placement_strategy` says; copy i takes bundle i, and each rebuild of it runs there, so a
    rebuilt copy lands where the dead one was. An autoscaled copy takes a bundle a drained copy gave
    back, else a one-bundle group of its own, removed when that copy stops."""

    def __init__(self, config: StageDeployConfig, gpu: bool, what: str):
        self.what = what
        self.one = bundle(actor_resources(config, gpu))
        check_placeable(self.one, what)
        self.group = reserve([self.one] * config.num_replicas, config.ray_placement_strategy, what)
        self._free = list(range(config.num_replicas))  # bundles of the start group no copy holds
        self._lock = threading.Lock()

    def take(self) -> tuple[Any, int]:
        """(placement group, bundle index) for a new copy; waits until Ray placed a new group."""
        with self._lock:
            if self._free:
                return self.group, self._free.pop(0)
        return reserve([self.one], "PACK", self.what), 0

    def give_back(self, placement: tuple[Any, int]) -> None:
        group, index = placement
        if group is self.group:
            with self._lock:
                self._free = sorted(self._free + [index])
        else:
            release(group)

    def close(self) -> None:
        release(self.group)


def release(group: Any) -> None:
    """Remove a placement group; safe when Ray is already shut down."""
    ray = import_ray()
    if group is None or not ray.is_initialized():
        return
    from ray.util.placement_group import remove_placement_group

    try:
        remove_placement_group(group)
    except Exception:  # noqa: BLE001 - already gone with its cluster
        pass


def kill(actor: Any) -> None:
    """Kill an actor (no restart); safe when it or Ray is already gone."""
    ray = import_ray()
    if actor is None or not ray.is_initialized():
        return
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001
        pass


def is_actor_death(e: BaseException) -> bool:
    ray = import_ray()
    return isinstance(e, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError)


def death_reason(e: BaseException) -> str:
    """The first line of Ray's long actor-death message."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def joined(address: str | None = None) -> Any:
    """The `ray` module, in a process that has joined the cluster (see ensure_ray)."""
    ensure_ray(address)
    return import_ray()


# --- the stage actor and its endpoint ------------------------------------------------------

class StageActor:
    """The body of a Ray stage actor (see the module docstring)."""

    def __init__(self, build: EngineBuilder, channel: Channel, num_threads: int):
        import torch

        torch.set_num_threads(num_threads)  # the CPUs it reserved, whatever the Ray worker was started with
        engine = build()
        self.channel = channel
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._order_lock = threading.Lock()
        self._early: dict[int, tuple[str, Any]] = {}  # commands that arrived before an earlier one
        self._next_seq = 0
        self._cond = threading.Condition()
        self._events: list[Event] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, args=(engine,), name="omnistage-ray-stage", daemon=True)
        self._thread.start()

    def ready(self) -> tuple[int, str]:
        """(pid, Ray node id) of this actor."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    def command(self, seq: int, kind: str, body: Any) -> None:
        """Queue a command in the order the endpoint numbered it (a threaded actor may run
        calls out of order, and a streamed chunk must not overtake the request it extends)."""
        with self._order_lock:
            self._early[seq] = (kind, body)
            while self._next_seq in self._early:
                self._commands.put(self._early.pop(self._next_seq))
                self._next_seq += 1

    def poll(self, timeout_s: float) -> list[Event] | None:
        """The events since the last poll (outputs through the channel), as soon as there are
        some or after `timeout_s`. Returned as they are, not pickled: Ray's own serializer
        must see the object refs inside, or it frees their objects before the caller reads them."""
        with self._cond:
            self._cond.wait_for(lambda: self._events or self._stopped, timeout_s)
            events, self._events = self._events, []
            if self._stopped and not any(event[0] == "died" for event in events):
                events.append(("died", "the stage loop stopped", False))
        return pack_events(self.channel, events) if events else None

    def close(self) -> None:
        self._commands.put(("close", None))
        self._thread.join(CLOSE_TIMEOUT_S)

    def _serve(self, engine: Any) -> None:
        try:
            serve(engine, self._receive, self._send)
        except BaseException:  # noqa: BLE001 - reported by poll() as the stage stopping
            logger.exception("the Ray stage loop failed")
        finally:
            with self._cond:
                self._stopped = True
                self._cond.notify_all()

    def _receive(self, timeout: float) -> list[tuple[str, Any]]:
        return [(kind, self.channel.get(body) if kind == "add" else body)
                for kind, body in drain(self._commands, timeout)]

    def _send(self, events: list[Event]) -> None:
        with self._cond:
            self._events += events
            self._cond.notify_all()


class RayEndpoint:
    """An engine in a Ray actor placed with `config`'s `ray_resources`, and a GPU when `gpu`
    (see wants_gpu; `build` then expects the devices as the actor sees them, devices_in_actor)."""

    beats = True

    def __init__(self, label: str, build: EngineBuilder, channel: Channel, config: StageDeployConfig, gpu: bool,
                 placement: tuple[Any, int] | None = None):
        """`placement`: (placement group, bundle index) the actor runs in (a copy of a stage with
        num_replicas; see reserve_replicas), else Ray places it by its resources alone."""
        ray = import_ray()
        self.label = label
        self.channel = channel
        self.pid: int | None = None
        self.node_id: str | None = None  # the Ray node the actor runs on (after wait_ready)
        self._seq = 0  # numbers the commands, which the actor applies in this order
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._gone = False
        self._closing = threading.Event()
        self._waker = Waker()
        resources = actor_resources(config, gpu)
        check_placeable(bundle(resources), f"stage {label}")
        scheduling = {}
        if placement is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            group, index = placement
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
            scheduling = {"scheduling_strategy": strategy}
        self.actor = ray.remote(StageActor).options(
            **resources, max_concurrency=4, max_restarts=0, **scheduling, **runtime_env(config.env),
        ).remote(build, channel, max(1, int(resources["num_cpus"])))
        self._ready = self.actor.ready.remote()
        self._poller = threading.Thread(target=self._poll_loop, name=f"omnistage-ray-poll-{label}", daemon=True)
        self._poller.start()

    def wait_ready(self, timeout: float) -> None:
        ray = import_ray()
        try:
            self.pid, self.node_id = ray.get(self._ready, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            self.close(graceful=False)
            raise RuntimeError(f"stage {self.label} did not start within {timeout:.0f} s (runtime 'ray': does the "
                               f"cluster have its ray_resources? it has {ray.cluster_resources()})") from None
        except Exception as e:
            self.close(graceful=False)
            raise RuntimeError(f"stage {self.label} failed to start in its Ray actor:\n{e}") from None

    def send(self, kind: str, body: Any) -> str | None:
        if self._gone:
            return None
        try:
            self.actor.command.remote(self._seq, kind, self.channel.put(body) if kind == "add" else body)
        except Exception as e:
            return f"cannot send the request to the Ray stage: {describe(e)}"
        self._seq += 1
        return None

    def step(self) -> list[Event]:
        if self._gone:
            return []
        self._waker.drain()
        events: list[Event] = []
        while True:
            try:
                event = self._inbox.get_nowait()
            except queue.Empty:
                break
            if event[0] == "outputs":
                try:
                    event = ("outputs", self.channel.get(event[1]))
                except Exception as e:  # noqa: BLE001 - e.g. the actor that owned the objects died
                    event = ("died", f"the Ray stage's outputs were lost: {describe(e)}", False)
            events.append(event)
            if event[0] == "died":
                self._gone = True
                break
        return events

    def _poll_loop(self) -> None:
        """The poller thread: one `poll` in flight at a time; what it brings goes to the inbox."""
        ray = import_ray()
        while not self._closing.is_set():
            try:
                events = ray.get(self.actor.poll.remote(POLL_S))
            except Exception as e:  # noqa: BLE001 - the actor is gone (killed, its node lost, closed)
                if not self._closing.is_set():
                    self._inbox.put(("died", f"Ray stage actor died: {death_reason(e)}", False))
                    self._waker.wake()
                return
            if events is None:
                continue
            for event in events:
                self._inbox.put(event)
            self._waker.wake()
            if any(event[0] == "died" for event in events):
                return

    def has_local_work(self) -> bool:
        return False

    def wait_objects(self) -> list[Any]:
        return [] if self._gone else [self._waker]

    def close(self, graceful: bool = True) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        ray = import_ray()
        if graceful and ray.is_initialized():
            try:
                ray.get(self.actor.close.remote(), timeout=CLOSE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - dead already, or stuck: killed below
                pass
        kill(self.actor)
        self._poller.join(POLL_S + CLOSE_TIMEOUT_S)
        self._waker.close()
        self.channel.sweep()
