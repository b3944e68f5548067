"""The Ray executor: one Ray actor per worker rank, anywhere in a Ray cluster.

Placement: a placement group reserves one bundle per rank (`ray_resources` each, CPU 1 and
GPU 1 on CUDA by default), PACK by default (`ray_placement_strategy`); each rank's actor
sits in its bundle. The ranks form a torch.distributed group (gloo on CPU, nccl on CUDA)
through a TCPStore that rank 0's actor hosts on a free port of its node.

Calls: `collective_rpc` sends the call to every actor and waits on all the replies at
once; results come back through Ray (its object store for large ones). Progress events of
rank 0 come back with its reply (every call is one denoising step, so a bar still moves
each step).

Failure: the same rules as `mp`. A dead actor's reply fails at once (Ray knows when the
process is gone), so the call in flight raises `WorkerDiedError` within seconds even while
the other ranks wait in a collective; the executor then stays unhealthy. While idle, a
ping at most every `PING_INTERVAL_S` notices a death. `close()` kills the actors and
removes the placement group.
"""

from __future__ import annotations

import os
import time
from typing import Any

from omnistage.diffusion.executor.base import Executor
from omnistage.diffusion.runner import ProgressSink, error_message
from omnistage.diffusion.worker import DiffusionWorker, WorkerConfig
from omnistage.runtime import ray as ray_utils
from omnistage.runtime.process import WorkerDiedError

PING_INTERVAL_S = 1.0
SHUTDOWN_TIMEOUT_S = 5.0


class RayWorker:
    """The body of one rank's actor (wrapped by `ray.remote` when the executor starts)."""

    def __init__(self, config: WorkerConfig, rank: int):
        os.environ.update(config.stage.env)
        self.worker = DiffusionWorker(config, rank)
        self._store = None

    def host_store(self) -> tuple[str, int]:
        """Rank 0: host the group's TCPStore on a free port; return where the ranks find it."""
        import ray
        import torch.distributed as dist

        self._store = dist.TCPStore("0.0.0.0", 0, None, True)
        return ray.util.get_node_ip_address(), self._store.port

    def start(self, store_host: str, store_port: int) -> tuple[str, Any]:
        try:
            self.worker.init_device()
            ray_utils.use_reserved_cpus(self.worker.config.stage)  # the bundle's CPUs, not the node's
            if self.worker.config.world_size > 1:
                self.worker.init_distributed(store_host, store_port)
            self.worker.load_model()
        except BaseException as exc:  # noqa: BLE001 - reported to the driver, which raises it
            return "error", error_message(exc)
        import ray

        return "ok", (os.getpid(), ray.get_runtime_context().get_node_id())

    def call(self, method: str, args: tuple, kwargs: dict, collect_progress: bool) -> tuple[str, Any]:
        """Run one RPC; returns ("ok", (result, progress events)) or ("error", message)."""
        events: list = []
        if collect_progress:
            kwargs["on_progress"] = events.extend
        try:
            return "ok", (getattr(self.worker, method)(*args, **kwargs), events)
        except Exception as exc:  # noqa: BLE001
            return "error", error_message(exc)

    def ping(self) -> None:
        return None


class RayExecutor(Executor):
    def __init__(self, config: WorkerConfig):
        super().__init__(config)
        ray = ray_utils.import_ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        stage = config.stage
        ray_utils.ensure_ray(stage.ray_address)
        # Ray gives each rank's actor its own GPU, which it sees as cuda:0.
        cuda = ray_utils.wants_gpu(stage.devices, ray.cluster_resources().get("GPU", 0))
        config = WorkerConfig(config.model_path, config.pipeline_cls,
                              ("cuda:0" if cuda else "cpu",) * config.world_size, stage)
        resources = ray_utils.actor_resources(stage, cuda)
        self._dead: str | None = None
        self._closed = False
        self.actors: list[Any] = []
        self._ping: list[Any] = []
        self._next_ping = 0.0
        ray_utils.check_placeable(ray_utils.bundle(resources), "executor 'ray'")
        self.placement_group = ray_utils.reserve([ray_utils.bundle(resources)] * config.world_size,
                                                 stage.ray_placement_strategy, "executor 'ray'")
        try:
            actor_cls = ray.remote(RayWorker)
            for rank in range(config.world_size):
                strategy = PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=rank)
                self.actors.append(actor_cls.options(
                    **resources, scheduling_strategy=strategy, max_restarts=0,
                    name=None, **ray_utils.runtime_env(stage.env),
                ).remote(config, rank))
            host, port = ray.get(self.actors[0].host_store.remote()) if config.world_size > 1 else ("", 0)
            replies = self._gather([actor.start.remote(host, port) for actor in self.actors])
            errors = [(rank, value) for rank, (kind, value) in enumerate(replies) if kind == "error"]
            if errors:
                rank, message = errors[0]
                raise RuntimeError(f"diffusion worker rank {rank} failed to start: {message}")
            self.pids = [pid for _, (pid, _) in replies]
            self.node_ids = [node for _, (_, node) in replies]
        except BaseException:
            self.close()
            raise

    # -- calls ---------------------------------------------------------------------------

    def collective_rpc(self, method: str, *args: Any, unique_reply_rank: int | None = None,
                       on_progress: ProgressSink | None = None, **kwargs: Any) -> Any:
        self._check_alive()
        replies = self._gather([actor.call.remote(method, args, kwargs, on_progress is not None and rank == 0)
                                for rank, actor in enumerate(self.actors)])
        errors = {rank: value for rank, (kind, value) in enumerate(replies) if kind == "error"}
        if errors:
            rank = min(errors)
            raise RuntimeError(f"diffusion worker rank {rank} failed: {errors[rank]}")
        results = [result for _, (result, _) in replies]
        if on_progress is not None and replies[0][1][1]:
            on_progress(replies[0][1][1])
        return results[unique_reply_rank] if unique_reply_rank is not None else results

    def _gather(self, refs: list[Any]) -> list[Any]:
        """Every rank's reply; an actor that died raises WorkerDiedError as soon as Ray knows."""
        ray = ray_utils.import_ray()
        results: list[Any] = [None] * len(refs)
        pending = {ref: rank for rank, ref in enumerate(refs)}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except Exception as e:
                    if ray_utils.is_actor_death(e):
                        self._raise_dead(rank, e)
                    raise
        return results

    # -- health --------------------------------------------------------------------------

    def _raise_dead(self, rank: int, e: BaseException) -> None:
        pid = self.pids[rank] if getattr(self, "pids", None) else "?"
        self._dead = f"diffusion worker rank {rank} (Ray actor, pid {pid}) died: {ray_utils.death_reason(e)}"
        raise WorkerDiedError(self._dead)

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise WorkerDiedError(self._dead)

    def is_healthy(self) -> bool:
        """False once an actor died. Between calls a ping (at most one a second) notices a death."""
        if self._dead is not None or self._closed:
            return self._dead is None
        ray = ray_utils.import_ray()
        if self._ping:
            ready, _ = ray.wait(self._ping, num_returns=len(self._ping), timeout=0)
            for ref in ready:
                try:
                    ray.get(ref)
                except Exception as e:  # noqa: BLE001 - any failure of a ping means the actor is gone
                    self._dead = f"a diffusion worker (Ray actor) died: {ray_utils.death_reason(e)}"
                    return False
            if len(ready) == len(self._ping):
                self._ping = []
        elif time.monotonic() >= self._next_ping:
            self._next_ping = time.monotonic() + PING_INTERVAL_S
            self._ping = [actor.ping.remote() for actor in self.actors]
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        ray = ray_utils.import_ray()
        if self._dead is None and self.actors and ray.is_initialized():
            try:  # a clean shutdown destroys the process group; a dead group is just killed
                ray.get([actor.call.remote("shutdown", (), {}, False) for actor in self.actors],
                        timeout=SHUTDOWN_TIMEOUT_S)
            except Exception:  # noqa: BLE001
                pass
        for actor in self.actors:
            ray_utils.kill(actor)
        ray_utils.release(self.placement_group)
        self._dead = self._dead or "executor closed"
