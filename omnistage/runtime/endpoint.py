"""Endpoints: the supervisor's one view of an engine, wherever it runs.

An endpoint carries commands to an engine and brings back its events (loop.py): it picks
its transport once, the way vLLM's `EngineCoreClient.make_client` picks an in-process or a
busy-loop client.

- `InlineEndpoint`: the engine lives here; `step()` steps it in the caller's thread.
- `ProcessEndpoint`: the engine lives in a spawned child running `loop.serve`; commands go
  down a queue, events come back up a pipe, payloads through a `Channel`. `step()` only
  reads what arrived, and reports the child's death as a "died" event.
- `RayEndpoint` (ray.py): the same loop in a Ray actor.

Endpoints track no requests and make no policy: the supervisor does both.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import queue
import socket
import traceback
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from omnistage.core.types import StageOutput
from omnistage.runtime import process
from omnistage.runtime.channel import Channel
from omnistage.runtime.loop import EngineServer, Event, LoopStopped, describe, drain, serve

logger = logging.getLogger(__name__)

EngineBuilder = Callable[[], Any]
"""Builds the engine, in the process where it runs (picklable for process and Ray endpoints)."""


class Endpoint(Protocol):
    beats: bool
    """Whether its loop sends heartbeats (process and Ray: silence means it hung)."""

    def wait_ready(self, timeout: float) -> None:
        """Block until the engine is built; RuntimeError saying why if it failed."""

    def send(self, kind: str, body: Any) -> str | None:
        """Send a command ("add", "abort", "call"); a message when it could not be sent."""

    def step(self) -> list[Event]:
        """Events since the last call. Inline: after one engine step. Never blocks."""

    def has_local_work(self) -> bool:
        """Whether `step()` would compute here (so the caller must not sleep)."""

    def wait_objects(self) -> list[Any]:
        """Objects for `multiprocessing.connection.wait` that become ready when events arrive."""

    def close(self, graceful: bool = True) -> None:
        """Stop the engine; `graceful=False` kills it at once (it hung)."""


class Waker:
    """A socketpair that wakes a thread blocked in `multiprocessing.connection.wait`."""

    def __init__(self):
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)

    def wake(self) -> None:
        try:
            self._w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # the buffer is full (a wake-up is pending anyway) or the socket is closed

    def drain(self) -> None:
        try:
            while self._r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def fileno(self) -> int:
        return self._r.fileno()

    def close(self) -> None:
        self._r.close()
        self._w.close()


class InlineEndpoint:
    beats = False

    def __init__(self, build: EngineBuilder):
        self.server = EngineServer(build())
        self._calls: queue.SimpleQueue = queue.SimpleQueue()  # control calls may come from any thread

    def wait_ready(self, timeout: float) -> None:
        pass

    def send(self, kind: str, body: Any) -> str | None:
        if kind == "call":  # run on the stepping thread, never beside a step
            self._calls.put(body)
        else:
            self.server.handle(kind, body)
        return None

    def step(self) -> list[Event]:
        for body in drain(self._calls, 0.0):
            self.server.handle("call", body)
        return self.server.step()

    def has_local_work(self) -> bool:
        return self.server.has_work() or not self._calls.empty()

    def wait_objects(self) -> list[Any]:
        return []

    def close(self, graceful: bool = True) -> None:
        if not self.server.dead:
            self.server.dead = True
            self.server.close()


class ProcessEndpoint:
    """An engine in a spawned child process (see the module docstring). `channel` sends
    requests down; `child_channel` is the child's twin, here only to sweep what it left."""

    beats = True

    def __init__(self, label: str, build: EngineBuilder, channel: Channel, child_channel: Channel):
        self.label = label
        self.channel = channel
        self.child_channel = child_channel
        self.pid: int | None = None
        self._gone = False  # the child said it died, or its death was reported
        self._commands = process.queue()
        self._results, child_end = process.pipe(duplex=False)
        self._proc = process.spawn(stage_main, (build, child_channel, self._commands, child_end),
                                   name=f"omnistage-stage-{label}")
        child_end.close()
        # Not a daemon (a stage may start its own worker processes), so stop it when the
        # endpoint goes away or the interpreter exits without close().
        self._finalizer = weakref.finalize(self, _stop, self._proc, self._commands, self._results,
                                           [channel, child_channel], True)

    def wait_ready(self, timeout: float) -> None:
        if not self._results.poll(timeout):
            self.close(graceful=False)
            raise RuntimeError(f"stage {self.label} did not start within {timeout:.0f} s")
        try:
            kind, body = self._results.recv()
        except (EOFError, OSError):
            kind, body = "init_error", f"the stage process {process.describe_exit(self._proc)[0]}"
        if kind != "ready":
            self.close()
            raise RuntimeError(f"stage {self.label} failed to start:\n{body}")
        self.pid = body

    def send(self, kind: str, body: Any) -> str | None:
        if self._gone:
            return None  # the supervisor learns of the death from step()
        try:
            # Pickled here, not in the queue's feeder thread, where a failure would be lost.
            message = pickle.dumps(self.channel.put(body) if kind == "add" else body, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            return f"cannot send the request to the stage process: {describe(e)}"
        self._commands.put((kind, message))
        return None

    def step(self) -> list[Event]:
        if self._gone:
            return []
        events: list[Event] = []
        try:
            while self._results.poll():
                for event in pickle.loads(self._results.recv_bytes()):
                    if event[0] == "outputs":
                        event = ("outputs", self.channel.get(event[1]))
                    events.append(event)
        except (EOFError, OSError):
            pass  # the child is gone; reported below
        if any(event[0] == "died" for event in events):
            self._gone = True
        elif not self._proc.is_alive():
            how, crashed = process.describe_exit(self._proc)
            events.append(("died", f"stage process died ({how})", crashed))
            self._gone = True
        if self._gone:
            self._finalizer.detach()
            _stop(self._proc, self._commands, self._results, [self.channel, self.child_channel], False)
        return events

    def has_local_work(self) -> bool:
        return False

    def wait_objects(self) -> list[Any]:
        return [] if self._gone else [self._results, self._proc.sentinel]

    def close(self, graceful: bool = True) -> None:
        if self._finalizer.alive:
            self._finalizer.detach()
            _stop(self._proc, self._commands, self._results, [self.channel, self.child_channel], graceful)


def _stop(proc: Any, commands: Any, results: Any, channels: list[Channel], graceful: bool) -> None:
    if proc.is_alive():
        if graceful:
            try:
                commands.put(("close", None))
            except (OSError, ValueError):
                pass
        else:
            proc.kill()  # it hung: a stopped process would not even take SIGTERM
        process.stop([proc])
    commands.cancel_join_thread()  # the reader may be dead: do not block on unsent commands
    commands.close()
    results.close()
    for channel in channels:
        channel.sweep()


def stage_main(build: EngineBuilder, channel: Channel, commands: Any, results: Any) -> None:
    """Body of a stage process: build the engine, then serve it until closed or orphaned."""
    process.prepare_child()
    try:
        engine = build()
    except BaseException:
        results.send(("init_error", traceback.format_exc()))
        return
    results.send(("ready", os.getpid()))
    parent = mp.parent_process()

    def receive(timeout: float) -> list[tuple[str, Any]]:
        messages = drain(commands, timeout)
        if not messages and timeout > 0 and parent is not None and not parent.is_alive():
            raise LoopStopped()
        return [(kind, None if kind == "close" else channel.get(pickle.loads(body)) if kind == "add"
                 else pickle.loads(body)) for kind, body in messages]

    def send(events: list[Event]) -> None:
        results.send_bytes(pickle.dumps(pack_events(channel, events), protocol=pickle.HIGHEST_PROTOCOL))

    serve(engine, receive, send)


def pack_events(channel: Channel, events: list[Event]) -> list[Event]:
    """The events with their outputs put through the channel; outputs that cannot be sent
    become error outputs instead of killing the stage."""
    packed = []
    for event in events:
        if event[0] == "outputs":
            try:
                event = ("outputs", channel.put(event[1]))
            except Exception as e:
                logger.exception("stage outputs cannot be sent")
                event = ("outputs", channel.put(unsendable(event[1], e)))
        packed.append(event)
    return packed


def unsendable(outputs: list[StageOutput], e: BaseException) -> list[StageOutput]:
    return [StageOutput(out.request_id, None, finished=True, error=f"the stage output cannot be sent: {describe(e)}")
            for out in outputs]
