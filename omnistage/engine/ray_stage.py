"""`runtime: ray`: a stage engine in a Ray actor, on whichever node has its `ray_resources`.

`StageActor` is the process stage's busy loop (`run_stage_process`) moved into an actor:
it builds the engine (inside a `GuardedEngine`) when the actor starts, then a thread of
its own steps it while `add`/`abort` calls queue commands for it. The actor is threaded,
so `poll` can wait for outputs while the loop computes; as a threaded actor may run calls
out of order, the handle numbers its `add`/`abort` calls and the actor applies them in
that order (a streamed chunk never overtakes its request).

`RayStageHandle` is the orchestrator's side. A poller thread keeps one `poll` call in
flight (a long poll: it returns when outputs are ready, or after `POLL_S`), queues what
comes back and wakes the orchestrator through a socket, so `step()` never blocks. An
actor that dies (or whose engine turns unhealthy, e.g. a worker of its executor died)
fails every request the handle held and makes it unhealthy; with a restart policy the
`RestartingStageHandle` then builds a new actor. `close()` kills the actor.

Payloads ride in the actor calls (Ray's serialization, its object store for large
ones). With `connector: ray` they are put into the object store explicitly, with tensors
as raw buffers (connectors.RayConnector). Shared memory does not cross machines, so a
Ray stage takes `connector: shm` as `inline` (Ray's own transport).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import socket
import threading
from typing import TYPE_CHECKING, Any

from omnistage.core.errors import ErrorKind
from omnistage.core.types import StageOutput, StageRequest
from omnistage.engine import ray_utils
from omnistage.engine.connectors import Connector
from omnistage.engine.stage_handle import CLOSE_TIMEOUT_S, GuardedEngine, StageHandle, error_output

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.engine.factory import EngineFactory

logger = logging.getLogger(__name__)

POLL_S = 1.0
"""Longest a `poll` call waits for outputs; bounds how long close() waits on the poller."""
_IDLE_WAIT_S = 0.05  # how long the actor's idle loop waits for a command before stepping again


class StageActor:
    """The body of a Ray stage actor (see the module docstring)."""

    def __init__(self, factory: EngineFactory, engine_args: tuple, connector: Connector):
        from omnistage.config.spec import StageSpec

        model_path, stage_fields, config = engine_args
        os.environ.update(config.env)
        ray_utils.use_reserved_cpus(config)
        self.engine = GuardedEngine(factory(model_path, StageSpec(**stage_fields), config))
        self.connector = connector
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._order_lock = threading.Lock()
        self._early: dict[int, tuple[str, Any]] = {}  # commands that arrived before an earlier one
        self._next_seq = 0
        self._cond = threading.Condition()
        self._outputs: list[StageOutput] = []
        self._unhealthy: str | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="omnistage-ray-stage", daemon=True)
        self._thread.start()

    def ready(self) -> tuple[int, str]:
        """(pid, Ray node id) of this actor."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    def add(self, seq: int, sent: Any) -> None:
        self._queue(seq, ("add", sent))

    def abort(self, seq: int, request_id: str) -> None:
        self._queue(seq, ("abort", request_id))

    def _queue(self, seq: int, command: tuple[str, Any]) -> None:
        """Queue commands in the order the handle numbered them: a threaded actor may run calls
        out of order, and a streamed chunk must not overtake the request it extends."""
        with self._order_lock:
            self._early[seq] = command
            while self._next_seq in self._early:
                self._commands.put(self._early.pop(self._next_seq))
                self._next_seq += 1

    def poll(self, timeout_s: float) -> tuple[Any, str | None]:
        """(the outputs since the last poll, sent through the connector, or None; why the
        engine stopped, or None), as soon as there is something to say or after `timeout_s`."""
        with self._cond:
            self._cond.wait_for(lambda: self._outputs or self._unhealthy or self._stopped, timeout_s)
            outputs, self._outputs = self._outputs, []
            unhealthy = self._unhealthy or ("the stage loop stopped" if self._stopped else None)
        return (self._send(outputs) if outputs else None), unhealthy

    def close(self) -> None:
        self._commands.put(("close", None))
        self._thread.join(CLOSE_TIMEOUT_S)

    def _send(self, outputs: list[StageOutput]) -> Any:
        try:
            return self.connector.put(outputs)
        except Exception as e:  # noqa: BLE001 - an output that cannot be sent fails its request
            logger.exception("stage outputs cannot be sent")
            return [error_output(out.request_id, f"the stage output cannot be sent: {type(e).__name__}: {e}")
                    for out in outputs]

    def _loop(self) -> None:
        try:
            while self._serve_once():
                pass
        except BaseException:  # noqa: BLE001 - reported by poll() as the stage stopping
            logger.exception("the Ray stage loop failed")
        finally:
            with self._cond:
                self._stopped = True
                self._cond.notify_all()

    def _serve_once(self) -> bool:
        """Apply waiting commands and step the engine once; False when the loop must end."""
        engine = self.engine
        commands = []
        if not engine.has_unfinished_requests():  # idle: wait a moment for work
            try:
                commands.append(self._commands.get(timeout=_IDLE_WAIT_S))
            except queue.Empty:
                pass
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                break
        for kind, body in commands:
            if kind == "add":
                engine.add_request(self.connector.get(body))
            elif kind == "abort":
                engine.abort_request(body)
            elif kind == "close":
                engine.close()
                return False
        outputs = engine.step()
        healthy = engine.is_healthy()
        if not healthy:  # what it failed may be retried once the stage is rebuilt
            for out in outputs:
                if out.error is not None and out.error_kind is None:
                    out.error_kind = ErrorKind.UNAVAILABLE
        with self._cond:
            self._outputs += outputs
            if not healthy:
                errors = [out.error for out in outputs if out.error]
                self._unhealthy = "the stage engine became unhealthy" + (f": {errors[0]}" if errors else "")
            if outputs or not healthy:
                self._cond.notify_all()
        if not healthy:
            engine.close()
        return healthy


class RayStageHandle(StageHandle):
    """A stage engine in a Ray actor (see the module docstring)."""

    def __init__(self, label: str, engine_args: tuple, factory: EngineFactory, connector: Connector,
                 config: StageDeployConfig):
        ray = ray_utils.import_ray()
        ray_utils.ensure_ray(config.ray_address)
        self.label = label
        self.connector = connector
        self.live: set[str] = set()
        self.dead_reason: str | None = None
        self._down: str | None = None  # set by the poller thread when the actor died or stopped
        self.pid: int | None = None
        self.node_id: str | None = None  # the Ray node the actor runs on (after wait_ready)
        self._failed: list[StageOutput] = []
        self._seq = 0  # numbers the add/abort calls, which the actor applies in this order
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        gpu = ray_utils.wants_gpu(config.devices, ray.cluster_resources().get("GPU", 0))
        resources = ray_utils.actor_resources(config, gpu)
        ray_utils.check_placeable(ray_utils.bundle(resources), f"stage {label}")
        model_path, stage_fields, config = engine_args
        config = dataclasses.replace(config, devices=ray_utils.devices_in_actor(config.devices, config.num_devices, gpu))
        engine_args = (model_path, stage_fields, config)
        self.actor = ray.remote(StageActor).options(
            **resources, max_concurrency=4, max_restarts=0,
            **ray_utils.runtime_env(config.env),
        ).remote(factory, engine_args, connector)
        self._ready = self.actor.ready.remote()
        self._poller = threading.Thread(target=self._poll_loop, name=f"omnistage-ray-poll-{label}", daemon=True)
        self._poller.start()

    def wait_ready(self, timeout: float) -> None:
        ray = ray_utils.import_ray()
        try:
            self.pid, self.node_id = ray.get(self._ready, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise RuntimeError(f"stage {self.label} did not start within {timeout:.0f} s (runtime 'ray': does the "
                               f"cluster have its ray_resources? it has {ray.cluster_resources()})") from None
        except Exception as e:
            self.close()
            raise RuntimeError(f"stage {self.label} failed to start in its Ray actor:\n{e}") from None

    # -- requests ------------------------------------------------------------------------

    def add_request(self, request: StageRequest) -> None:
        if self.dead_reason is not None:
            self._failed.append(error_output(request.request_id, self.dead_reason))
            return
        try:
            sent = self.connector.put(request)
            self.actor.add.remote(self._seq, sent)
            self._seq += 1
        except Exception as e:
            self._failed.append(error_output(request.request_id, f"cannot send the request to the Ray stage: "
                                                                   f"{type(e).__name__}: {e}"))
            return
        self.live.add(request.request_id)

    def abort_request(self, request_id: str) -> None:
        if request_id in self.live:
            self.live.discard(request_id)
            self.actor.abort.remote(self._seq, request_id)
            self._seq += 1

    def step(self) -> list[StageOutput]:
        outputs, self._failed = self._failed, []
        if self.dead_reason is not None:
            return outputs
        try:
            while self._wake_r.recv(64):
                pass
        except (BlockingIOError, OSError):
            pass
        while True:
            try:
                kind, body = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "outputs":
                try:
                    outputs += self._keep_live(self.connector.get(body))
                except Exception as e:  # noqa: BLE001 - e.g. the actor that owned the objects died
                    self._down = self._down or f"the Ray stage's outputs were lost: {type(e).__name__}: {e}"
                    self._inbox.put(("dead", self._down))
            elif self.dead_reason is None:  # "dead"
                self.dead_reason = body
                logger.error("stage %s: %s", self.label, body)
        if self.dead_reason is not None:
            outputs += [error_output(rid, self.dead_reason) for rid in sorted(self.live)]
            self.live.clear()
        return outputs

    def _poll_loop(self) -> None:
        """The poller thread: one `poll` in flight at a time; what it brings goes to the inbox."""
        ray = ray_utils.import_ray()
        while not self._closing.is_set():
            try:
                sent, unhealthy = ray.get(self.actor.poll.remote(POLL_S))
            except Exception as e:  # noqa: BLE001 - the actor is gone (killed, its node lost, closed)
                if not self._closing.is_set():
                    self._down = f"Ray stage actor died: {ray_utils.death_reason(e)}"
                    self._inbox.put(("dead", self._down))
                    self._wake()
                return
            if sent is not None:
                self._inbox.put(("outputs", sent))
            if unhealthy is not None:
                self._down = unhealthy
                self._inbox.put(("dead", unhealthy))
            if sent is not None or unhealthy is not None:
                self._wake()
            if unhealthy is not None:
                return

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    # -- state ---------------------------------------------------------------------------

    def wait_objects(self) -> list[Any]:
        return [] if self.dead_reason is not None else [self._wake_r]

    def is_healthy(self) -> bool:
        return self.dead_reason is None and self._down is None

    def close(self) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        ray = ray_utils.import_ray()
        if ray.is_initialized():
            try:
                ray.get(self.actor.close.remote(), timeout=CLOSE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - dead already, or stuck: killed below
                pass
        ray_utils.kill(self.actor)
        self._poller.join(POLL_S + CLOSE_TIMEOUT_S)
        self._wake_r.close()
        self._wake_w.close()
        self.connector.sweep()
