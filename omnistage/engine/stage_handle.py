"""StageHandle: the orchestrator's one view of a stage, wherever its engine runs.

`make_stage_handle` picks the transport once, from the stage's deploy `runtime`, the way
vLLM's `EngineCoreClient.make_client` picks an in-process or a busy-loop client:

- "inline": `InprocStageHandle` holds the engine; `step()` steps it in the caller's thread.
- "process": `ProcessStageHandle` spawns a child that runs `run_stage_process`, a busy
  loop around the same `GuardedEngine`; commands go down a queue, outputs come back up a
  pipe, payloads through the connector. `step()` only collects what arrived. (Spawned:
  a script that starts process stages needs the `if __name__ == "__main__":` guard.)
- "ray": `RayStageHandle` (ray_stage.py) runs the same loop in a Ray actor, on the node
  that has the stage's `ray_resources`.

Either way the engine sits inside a `GuardedEngine`, which turns engine failures into
error outputs: `add_request` raising fails that request, `step` raising fails the
requests the engine held. A stage process that dies fails every request it held and
makes the handle unhealthy; nothing waits on it forever.

With a `RestartPolicy`, the handle is wrapped in a `RestartingStageHandle` (restart.py),
which rebuilds the stage when it dies.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import queue
import traceback
import weakref
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from omnistage.core.errors import ErrorKind
from omnistage.core.types import StageOutput, StageRequest
from omnistage.engine.connectors import Connector, make_connector

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.config.spec import StageSpec
    from omnistage.core.types import Engine
    from omnistage.engine.factory import EngineFactory
    from omnistage.engine.restart import RestartPolicy

logger = logging.getLogger(__name__)

_PARENT_CHECK_S = 1.0  # how often an idle stage process checks that the orchestrator lives
CLOSE_TIMEOUT_S = 10.0


class GuardedEngine:
    """An engine whose failures come back as error outputs, never as exceptions.

    It also tracks the requests the engine holds, so it can fail them all when a step
    raises and drop outputs that arrive for a request after its abort.
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        self.live: set[str] = set()
        self._errors: list[StageOutput] = []

    def add_request(self, request: StageRequest) -> None:
        try:
            self.engine.add_request(request)
        except ValueError as e:  # the engine refused the request's inputs or params: the caller's mistake
            logger.info("request %s refused: %s", request.request_id, e)
            self._errors.append(error_output(request.request_id, str(e), ErrorKind.INVALID_REQUEST, getattr(e, "param", None)))
            return
        except Exception as e:
            logger.exception("add_request(%s) failed", request.request_id)
            self._errors.append(error_output(request.request_id, f"add_request raised {_describe(e)}"))
            return
        self.live.add(request.request_id)

    def abort_request(self, request_id: str) -> None:
        if request_id not in self.live:
            return
        self.live.discard(request_id)
        try:
            self.engine.abort_request(request_id)
        except Exception:
            logger.exception("abort_request(%s) failed", request_id)

    def has_unfinished_requests(self) -> bool:
        # The engine's word, not `live`: an engine may still hold an aborted request
        # (and its cache) until its next step.
        return bool(self._errors) or self.engine.has_unfinished_requests()

    def step(self) -> list[StageOutput]:
        outputs, self._errors = self._errors, []
        if not self.engine.has_unfinished_requests():
            return outputs
        try:
            stepped = self.engine.step()
        except Exception as e:
            # The engine cannot say which request broke the batch: fail all it held.
            logger.exception("engine step failed")
            message = f"engine step raised {_describe(e)}"
            for request_id in sorted(self.live):
                self.abort_request(request_id)
                outputs.append(error_output(request_id, message))
            return outputs
        for out in stepped:
            if out.request_id not in self.live:
                continue  # aborted while the engine was working on it
            if out.finished or out.error is not None:
                self.live.discard(out.request_id)
            outputs.append(out)
        return outputs

    def is_healthy(self) -> bool:
        try:
            return bool(self.engine.is_healthy())
        except Exception:
            logger.exception("is_healthy failed")
            return False

    def close(self) -> None:
        try:
            self.engine.close()
        except Exception:
            logger.exception("engine close failed")


class StageHandle:
    """What the orchestrator calls on a stage (see the module docstring)."""

    def add_request(self, request: StageRequest) -> None:
        raise NotImplementedError

    def abort_request(self, request_id: str) -> None:
        raise NotImplementedError

    def step(self) -> list[StageOutput]:
        """Outputs since the last call. Inline: runs one engine step. Never blocks."""
        raise NotImplementedError

    def has_local_work(self) -> bool:
        """Whether `step()` would compute here (so the caller must not sleep)."""
        return False

    def wait_objects(self) -> list[Any]:
        """Objects for `multiprocessing.connection.wait` that become ready when outputs arrive."""
        return []

    def wait_ready(self, timeout: float) -> None:
        """Block until the engine is built; raise RuntimeError naming the stage if it failed."""

    def is_healthy(self) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _keep_live(self, outputs: list[StageOutput]) -> list[StageOutput]:
        """The outputs of requests still live here (`self.live`, kept by the out-of-process
        handles); a finished or failed one stops being live."""
        kept = []
        for out in outputs:
            if out.request_id in self.live:
                if out.finished or out.error is not None:
                    self.live.discard(out.request_id)
                kept.append(out)
        return kept


class InprocStageHandle(StageHandle):
    def __init__(self, engine: Engine):
        self.engine = GuardedEngine(engine)

    def add_request(self, request: StageRequest) -> None:
        self.engine.add_request(request)

    def abort_request(self, request_id: str) -> None:
        self.engine.abort_request(request_id)

    def step(self) -> list[StageOutput]:
        return self.engine.step()

    def has_local_work(self) -> bool:
        return self.engine.has_unfinished_requests()

    def is_healthy(self) -> bool:
        return self.engine.is_healthy()

    def close(self) -> None:
        self.engine.close()


class ProcessStageHandle(StageHandle):
    """A stage engine in a spawned child process (see `run_stage_process`)."""

    def __init__(self, label: str, engine_args: tuple, factory: EngineFactory, connector: Connector,
                 child_connector: Connector):
        self.label = label
        self.connector = connector
        self.child_connector = child_connector  # the child's twin; here only to sweep what it left
        self.live: set[str] = set()
        self.dead_reason: str | None = None
        self._unhealthy: str | None = None  # why the child said it stops (its engine turned unhealthy)
        self._failed: list[StageOutput] = []
        ctx = mp.get_context("spawn")
        self._commands = ctx.Queue()
        self._results, child_end = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=run_stage_process,
            args=(factory, engine_args, child_connector, self._commands, child_end),
            name=f"omnistage-stage-{label}",
        )
        self._proc.start()
        child_end.close()
        # Not a daemon (a stage may start its own worker processes), so stop it when the
        # handle goes away or the interpreter exits without close().
        self._finalizer = weakref.finalize(self, _stop_process, self._proc, self._commands, self._results,
                                           [connector, child_connector])

    def wait_ready(self, timeout: float) -> None:
        if not self._results.poll(timeout):
            self.close()
            raise RuntimeError(f"stage {self.label} did not start within {timeout:.0f} s")
        try:
            kind, body = self._results.recv()
        except (EOFError, OSError):
            self._proc.join(CLOSE_TIMEOUT_S)
            kind, body = "init_error", f"the stage process exited with code {self._proc.exitcode}"
        if kind != "ready":
            self.close()
            raise RuntimeError(f"stage {self.label} failed to start:\n{body}")

    def add_request(self, request: StageRequest) -> None:
        if self.dead_reason is not None:
            self._failed.append(error_output(request.request_id, self.dead_reason))
            return
        try:
            # Pickled here, not in the queue's feeder thread, where a failure would be lost.
            message = pickle.dumps(self.connector.put(request), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            self._failed.append(error_output(request.request_id, f"cannot send the request to the stage "
                                                                   f"process: {_describe(e)}"))
            return
        self.live.add(request.request_id)
        self._commands.put(("add", message))

    def abort_request(self, request_id: str) -> None:
        if request_id in self.live:
            self.live.discard(request_id)
            self._commands.put(("abort", request_id))

    def step(self) -> list[StageOutput]:
        outputs, self._failed = self._failed, []
        if self.dead_reason is not None:
            return outputs
        try:
            while self._results.poll():
                kind, body = self._results.recv()
                if kind == "outputs":
                    outputs += self._keep_live(self.connector.get(body))
                elif kind == "unhealthy":
                    self._unhealthy = body
        except (EOFError, OSError):
            pass  # the child is gone; the liveness check below reports it
        if self._unhealthy is not None:  # the child is stopping: nothing it holds will finish
            self.dead_reason = self._unhealthy
            logger.error("stage %s: %s", self.label, self.dead_reason)
        elif not self._proc.is_alive() and self.dead_reason is None:
            self._on_death()
        if self.dead_reason is not None:
            outputs += [error_output(rid, self.dead_reason) for rid in sorted(self.live)]
            self.live.clear()
        return outputs

    def _on_death(self) -> None:
        self.dead_reason = f"stage process died (exit code {self._proc.exitcode})"
        logger.error("stage %s: %s", self.label, self.dead_reason)
        self._finalizer()  # frees its queue and shared memory

    def wait_objects(self) -> list[Any]:
        return [] if self.dead_reason is not None else [self._results, self._proc.sentinel]

    def is_healthy(self) -> bool:
        return self.dead_reason is None and self._proc.is_alive()

    def close(self) -> None:
        self._finalizer()


def _stop_process(proc: Any, commands: Any, results: Any, connectors: list[Connector]) -> None:
    if proc.is_alive():
        try:
            commands.put(("close", None))
        except (OSError, ValueError):
            pass
        proc.join(CLOSE_TIMEOUT_S)
        if proc.is_alive():
            proc.terminate()
            proc.join(CLOSE_TIMEOUT_S)
    commands.cancel_join_thread()  # the reader may be dead: do not block on unsent commands
    commands.close()
    results.close()
    for connector in connectors:
        connector.sweep()


def run_stage_process(factory: EngineFactory, engine_args: tuple, connector: Connector, commands: Any,
                      results: Any) -> None:
    """Body of a stage process: build the engine, then step it while taking commands."""
    model_path, stage_fields, config = engine_args
    os.environ.update(config.env)
    try:
        from omnistage.config.spec import StageSpec

        engine = GuardedEngine(factory(model_path, StageSpec(**stage_fields), config))
    except BaseException:
        results.send(("init_error", traceback.format_exc()))
        return
    results.send(("ready", None))
    parent = mp.parent_process()
    while True:
        try:
            messages = _receive(commands, block=not engine.has_unfinished_requests())
        except _ParentGone:
            break
        for kind, body in messages:
            if kind == "add":
                engine.add_request(connector.get(pickle.loads(body)))
            elif kind == "abort":
                engine.abort_request(body)
            elif kind == "close":
                engine.close()
                return
        outputs = engine.step()
        healthy = engine.is_healthy()
        if not healthy:  # e.g. a worker process of its engine died: what it failed may be retried
            for out in outputs:
                if out.error is not None and out.error_kind is None:
                    out.error_kind = ErrorKind.UNAVAILABLE
        try:
            if not healthy:  # said first, so the parent is unhealthy before it sees the failures
                errors = [out.error for out in outputs if out.error]
                results.send(("unhealthy", "the stage engine became unhealthy" + (f": {errors[0]}" if errors else "")))
            if outputs:
                results.send_bytes(_outputs_message(connector, outputs))
            if not healthy:
                break  # exit, so that the parent sees a dead stage and (with a policy) rebuilds it
        except OSError:
            break  # the orchestrator closed its end
        if parent is not None and not parent.is_alive():
            break
    engine.close()


def _outputs_message(connector: Connector, outputs: list[StageOutput]) -> bytes:
    """The pickled message for `outputs` (the parent's `recv()` reads it); outputs that cannot
    be pickled become error outputs instead of killing the stage."""
    try:
        return pickle.dumps(("outputs", connector.put(outputs)), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        logger.exception("stage outputs cannot be sent")
        errors = [error_output(out.request_id, f"the stage output cannot be sent: {_describe(e)}") for out in outputs]
        return pickle.dumps(("outputs", errors), protocol=pickle.HIGHEST_PROTOCOL)


class _ParentGone(Exception):
    pass


def _receive(commands: Any, block: bool) -> list[tuple[str, Any]]:
    """Commands waiting in the queue; when `block`, wait for at least one."""
    messages = []
    parent = mp.parent_process()
    while block and not messages:
        try:
            messages.append(commands.get(timeout=_PARENT_CHECK_S))
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                raise _ParentGone() from None
    while True:
        try:
            messages.append(commands.get_nowait())
        except queue.Empty:
            return messages


def make_stage_handle(
    stage: StageSpec,
    config: StageDeployConfig,
    model_path: str,
    factory: EngineFactory,
    connector: str = "shm",
    shm_threshold_bytes: int = 64 * 1024,
    shm_prefix: str = "omni",
    restart_policy: RestartPolicy | None = None,
) -> StageHandle:
    """The handle for `config.runtime`; a process handle's segments are named `{shm_prefix}{p|c}N`.
    With `restart_policy`, it is wrapped in a `RestartingStageHandle`."""
    if restart_policy is not None:
        from omnistage.engine.restart import RestartingStageHandle  # it builds on this module

        def build(generation: int) -> StageHandle:
            return make_stage_handle(stage, config, model_path, factory, connector, shm_threshold_bytes,
                                     f"{shm_prefix}r{generation}")

        return RestartingStageHandle(stage.label, build(0), build, restart_policy)
    if config.runtime == "inline":
        return InprocStageHandle(factory(model_path, stage, config))
    if config.runtime == "process":
        if connector == "ray":
            raise ValueError(f"stage {stage.label}: connector 'ray' carries the payloads of runtime 'ray' stages; "
                             f"this stage has runtime 'process': give it runtime 'ray', or use connector 'shm'")
        return ProcessStageHandle(
            stage.label,
            (model_path, portable_stage_fields(stage), config),
            factory,
            make_connector(connector, f"{shm_prefix}p", shm_threshold_bytes),
            make_connector(connector, f"{shm_prefix}c", shm_threshold_bytes),
        )
    if config.runtime == "ray":
        from omnistage.engine.ray_stage import RayStageHandle  # it builds on this module

        # Shared memory does not cross machines: a Ray stage takes `shm` as Ray's own transport.
        carrier = make_connector("ray" if connector == "ray" else "inline", "", shm_threshold_bytes,
                                 config.ray_address)
        return RayStageHandle(stage.label, (model_path, portable_stage_fields(stage), config), factory, carrier,
                              config)
    raise ValueError(f"stage {stage.label}: unknown runtime {config.runtime!r}")


def portable_stage_fields(stage: StageSpec) -> dict[str, Any]:
    """StageSpec fields that can be pickled to a stage process.

    Processors stay behind (the orchestrator runs them, and lambdas do not pickle), and
    the read-only mappings become plain dicts (mappingproxy does not pickle).
    """
    values = {f.name: getattr(stage, f.name) for f in fields(stage)}
    values.update(input_processor=None, chunk_processor=None, defaults=dict(stage.defaults), hard=dict(stage.hard))
    return values


def error_output(request_id: str, message: str, kind: str | None = None, param: str | None = None) -> StageOutput:
    return StageOutput(request_id=request_id, payload=None, finished=True, error=message, error_kind=kind,
                       error_param=param)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"
