"""The engine loop, written once: apply commands, step the engine, report what happened.

`EngineServer` wraps one engine and turns everything it does into events, never into
exceptions that escape:

    ("outputs", [StageOutput])        what a step produced (and refusals of add_request)
    ("step_failed", message)          a step raised: the requests the engine held failed,
                                      the engine goes on
    ("died", message, crashed)        the engine cannot go on (a worker died, it turned
                                      unhealthy, it panicked); `crashed` as in WorkerDiedError
    ("beat", slowest_step_s)          the loop is alive (process and Ray loops only)
    ("reply", call_id, ok, value[, invalid])  the answer to a control call (`invalid`: it
                                      raised ValueError, the caller's arguments were wrong;
                                      a RequestError travels as itself, naming its field)

It tracks no requests: the supervisor on the other side of the endpoint does. An inline
endpoint drives an `EngineServer` from the orchestrator's thread; `serve()` is the busy loop
that drives one in a stage process or a Ray actor, sending a heartbeat at least every
`HEARTBEAT_S` so that a hung stage is noticed.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from typing import Any

from omnistage.core.errors import ErrorKind, RequestError
from omnistage.core.types import StageOutput
from omnistage.runtime.process import WorkerDiedError

logger = logging.getLogger(__name__)

HEARTBEAT_S = 0.5
"""Longest a live loop stays silent; an idle loop wakes this often to say it lives."""

Event = tuple
Command = tuple  # ("add", StageRequest) | ("abort", request_id) | ("call", (call_id, method, args)) | ("close", None)


class EngineServer:
    """One engine behind commands and events (see the module docstring)."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.slowest_step_s = 0.0
        self.dead = False
        self._events: list[Event] = []

    def handle(self, kind: str, body: Any) -> None:
        if self.dead:
            return
        if kind == "add":
            self._add(body)
        elif kind == "abort":
            try:
                self.engine.abort_request(body)
            except Exception:
                logger.exception("abort_request(%s) failed", body)
        elif kind == "call":
            call_id, method, args = body
            try:
                self._events.append(("reply", call_id, True, getattr(self.engine, method)(*args)))
            except RequestError as e:  # typed: the field it names reaches the caller
                self._events.append(("reply", call_id, False, e, True))
            except Exception as e:  # a ValueError is the caller's (bad arguments): it stays one on the other side
                self._events.append(("reply", call_id, False, describe(e), isinstance(e, ValueError)))

    def _add(self, request: Any) -> None:
        try:
            self.engine.add_request(request)
        except ValueError as e:  # the engine refused the request's inputs or params: the caller's mistake
            logger.info("request %s refused: %s", request.request_id, e)
            self._fail(request.request_id, str(e), ErrorKind.INVALID_REQUEST, getattr(e, "param", None))
        except Exception as e:
            logger.exception("add_request(%s) failed", request.request_id)
            self._fail(request.request_id, f"add_request raised {describe(e)}")
        except BaseException as e:  # a panic (e.g. pyo3's PanicException) leaves the engine unusable
            self._die(e)

    def _fail(self, request_id: str, message: str, kind: ErrorKind | None = None, param: str | None = None) -> None:
        self._events.append(("outputs", [StageOutput(request_id, None, finished=True, error=message,
                                                     error_kind=kind, error_param=param)]))

    def has_work(self) -> bool:
        return bool(self._events) or (not self.dead and self._engine_has_work())

    def _engine_has_work(self) -> bool:
        try:
            return bool(self.engine.has_unfinished_requests())
        except Exception:
            logger.exception("has_unfinished_requests failed")
            return False

    def step(self) -> list[Event]:
        """The events since the last call, after one engine step when the engine has work."""
        if not self.dead and self._engine_has_work():
            start = time.monotonic()
            try:
                outputs = self.engine.step()
            except WorkerDiedError as e:
                self._events.append(("died", str(e), e.crashed))
                self._close()
            except Exception as e:
                logger.exception("engine step failed")
                self._events.append(("step_failed", f"engine step raised {describe(e)}"))
            except BaseException as e:
                self._die(e)
            else:
                self.slowest_step_s = max(self.slowest_step_s, time.monotonic() - start)
                if outputs:
                    self._events.append(("outputs", outputs))
        if not self.dead and not self._healthy():
            self._events.append(("died", "the stage engine became unhealthy", False))
            self._close()
        events, self._events = self._events, []
        return events

    def _die(self, e: BaseException) -> None:
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise e
        logger.error("the engine panicked: %s", describe(e))
        self._events.append(("died", f"the engine panicked: {describe(e)}", True))
        self._close()

    def _healthy(self) -> bool:
        try:
            return bool(self.engine.is_healthy())
        except Exception:
            logger.exception("is_healthy failed")
            return False

    def _close(self) -> None:
        self.dead = True
        self.close()

    def close(self) -> None:
        try:
            self.engine.close()
        except BaseException:  # noqa: BLE001 - a broken engine may fail to close; it is dropped anyway
            logger.exception("engine close failed")


class LoopStopped(Exception):
    """Raised by a `receive` whose other end is gone: the loop ends."""


def serve(engine: Any, receive: Callable[[float], list[Command]], send: Callable[[list[Event]], None]) -> None:
    """The busy loop of a stage process or a Ray actor: until "close", a dead engine, or the
    other end going away (`receive` raising LoopStopped, `send` raising OSError).

    `receive(timeout)` returns the commands waiting, waiting up to `timeout` for the first;
    `send(events)` delivers events to the supervisor."""
    server = EngineServer(engine)
    last_sent = 0.0
    try:
        while True:
            commands = receive(0.0 if server.has_work() else HEARTBEAT_S)
            for kind, body in commands:
                if kind == "close":
                    return
                server.handle(kind, body)
            events = server.step()
            if time.monotonic() - last_sent >= HEARTBEAT_S:
                events.append(("beat", server.slowest_step_s))
            if events:
                send(events)
                last_sent = time.monotonic()
            if server.dead:
                return  # exit, so that the supervisor sees a dead stage and rebuilds it
    except (LoopStopped, OSError):
        pass
    finally:
        if not server.dead:
            server.close()


def drain(commands: Any, timeout: float) -> list[Command]:
    """Every command waiting in `commands` (a queue), waiting up to `timeout` for the first."""
    taken = []
    if timeout > 0:
        try:
            taken.append(commands.get(timeout=timeout))
        except queue.Empty:
            return taken
    while True:
        try:
            taken.append(commands.get_nowait())
        except queue.Empty:
            return taken


def describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"
