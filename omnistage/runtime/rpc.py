"""An object's async methods, served to other processes over pipes, written once.

`RpcHost` serves one object (the engine: `AsyncOmni`) to any number of connections, on its
asyncio loop; `RpcClient` is the other end, in another process, on that process's loop. A
method is either called (`call`: one awaited result) or streamed (`stream`: an async
generator, item by item). Every message goes through a `Channel` (channel.py), so large
items (images, audio, tensors) cross in shared memory as raw buffers, never re-encoded.

    client -> host   ("call", id, method, args, kwargs)    await obj.method(...), reply once
                     ("stream", id, method, args, kwargs)  iterate obj.method(...), reply per item
                     ("cancel", id)                        the client left a stream: cancel it
    host -> client   ("result", id, ok, value)             ok=False: value is the exception
                     ("item", id, value) ... ("end", id, ok, error)
                     ("state", {name: value})              the host's watched attributes, sent
                                                           to every client when they change

A connection that goes away (its process died) cancels every stream it had open, so no
dead client keeps the object busy; the host sweeps the shared memory it left. A client whose
host goes away fails what it waits for with `EngineUnavailableError` and calls `on_lost`.
Sends happen on a writer thread per side, so a client that stops reading never blocks the
host's loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from omnistage.core.errors import EngineUnavailableError
from omnistage.runtime.channel import Channel, sweep_shm, unpack
from omnistage.runtime.loop import describe

logger = logging.getLogger(__name__)


class _Link:
    """One end of a pipe: reads on the loop (`on_message`), writes on its own thread."""

    def __init__(self, conn: Any, channel: Channel, on_message: Callable[[tuple], None], on_closed: Callable[[], None]):
        self.conn = conn
        self.channel = channel
        self.closed = False
        self._on_message = on_message
        self._on_closed = on_closed
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(conn.fileno(), self._read)
        self._writer = threading.Thread(target=self._write, name="omnistage-rpc-writer", daemon=True)
        self._writer.start()

    def send(self, message: tuple) -> None:
        if not self.closed:
            self._outbox.put(message)

    def _write(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                packed = self.channel.put(message)
            except Exception as e:  # an unpicklable value: the caller hears why instead of waiting forever
                packed = self.channel.put(_unsendable(message, e))
            try:
                self.conn.send_bytes(pickle.dumps(packed, protocol=pickle.HIGHEST_PROTOCOL))
            except (OSError, ValueError):
                return  # the other end is gone; the reader notices

    def _read(self) -> None:
        try:
            while self.conn.poll():
                message = unpack(pickle.loads(self.conn.recv_bytes()))
                self._on_message(message)
        except (EOFError, OSError):
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self.conn.fileno())
        self._outbox.put(None)
        self._writer.join(5.0)
        self.conn.close()
        self._on_closed()


def _unsendable(message: tuple, e: BaseException) -> tuple:
    error = RuntimeError(f"the reply cannot be sent: {describe(e)}")
    if message[0] == "result":
        return ("result", message[1], False, error)
    if message[0] in ("item", "end"):
        return ("end", message[1], False, error)
    return ("state", {})


class RpcHost:
    """Serves `obj`'s `methods` (coroutines) and `streams` (async generators) to every attached
    connection; `state` names attributes sent to all clients whenever a call changes them."""

    def __init__(self, obj: Any, methods: Sequence[str], streams: Sequence[str], state: Sequence[str] = ()):
        self.obj = obj
        self.methods = frozenset(methods)
        self.streams = frozenset(streams)
        self.state_names = tuple(state)
        self._links: dict[_Link, dict[int, asyncio.Task]] = {}

    def attach(self, conn: Any, prefix: str) -> None:
        """Serve `conn` (call on the host's loop). `prefix` names the shared memory of both
        directions (the client writes under prefix + "c"), swept when the connection ends."""
        tasks: dict[int, asyncio.Task] = {}
        link = _Link(conn, Channel("shm", prefix + "h"), lambda m: self._handle(link, tasks, m),
                     lambda: self._detach(link, prefix))
        self._links[link] = tasks
        link.send(("state", self._state()))

    def _detach(self, link: _Link, prefix: str) -> None:
        for task in self._links.pop(link, {}).values():
            task.cancel()  # the client is gone: its streams (and so its engine requests) end
        sweep_shm(prefix)

    def _handle(self, link: _Link, tasks: dict[int, asyncio.Task], message: tuple) -> None:
        kind, call_id = message[0], message[1]
        if kind == "cancel":
            task = tasks.get(call_id)
            if task is not None:
                task.cancel()
            return
        method, args, kwargs = message[2:]
        allowed = self.methods if kind == "call" else self.streams
        if method not in allowed:
            link.send(("result" if kind == "call" else "end", call_id, False,
                       AttributeError(f"{method!r} is not served over rpc")))
            return
        run = self._call if kind == "call" else self._stream
        task = asyncio.ensure_future(run(link, call_id, getattr(self.obj, method), args, kwargs))
        tasks[call_id] = task
        task.add_done_callback(lambda _: tasks.pop(call_id, None))

    async def _call(self, link: _Link, call_id: int, fn: Callable, args: tuple, kwargs: dict) -> None:
        before = self._state()
        try:
            value = fn(*args, **kwargs)
            if asyncio.iscoroutine(value):
                value = await value
        except Exception as e:
            link.send(("result", call_id, False, e))
        else:
            link.send(("result", call_id, True, value))
        finally:
            self._broadcast_if_changed(before)

    async def _stream(self, link: _Link, call_id: int, fn: Callable, args: tuple, kwargs: dict) -> None:
        items = None
        try:
            items = fn(*args, **kwargs)
            async for item in items:
                link.send(("item", call_id, item))
        except Exception as e:
            link.send(("end", call_id, False, e))
        else:
            link.send(("end", call_id, True, None))
        finally:
            if items is not None:
                await items.aclose()  # cancelled: the generator's own cleanup (an engine abort) runs now

    def _state(self) -> dict[str, Any]:
        return {name: getattr(self.obj, name) for name in self.state_names}

    def _broadcast_if_changed(self, before: dict[str, Any]) -> None:
        after = self._state()
        if after != before:
            for link in self._links:
                link.send(("state", after))

    def close(self) -> None:
        for link in list(self._links):
            link.close()


class RpcClient:
    """The client end of an `RpcHost` connection; start it on its process's running loop."""

    def __init__(self, conn: Any, prefix: str, on_lost: Callable[[], None] | None = None):
        self.state: dict[str, Any] = {}
        """The host's watched attributes, as last sent."""
        self.lost = False
        self._conn = conn
        self._prefix = prefix
        self._on_lost = on_lost
        self._ids = itertools.count()
        self._calls: dict[int, asyncio.Future] = {}
        self._streams: dict[int, asyncio.Queue] = {}
        self._link: _Link | None = None

    def start(self) -> None:
        self._link = _Link(self._conn, Channel("shm", self._prefix + "c"), self._handle, self._closed)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        call_id = next(self._ids)
        future = self._calls[call_id] = asyncio.get_running_loop().create_future()
        self._send(("call", call_id, method, args, kwargs))
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def stream(self, method: str, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        call_id = next(self._ids)
        items = self._streams[call_id] = asyncio.Queue()
        self._send(("stream", call_id, method, args, kwargs))
        ended = False
        try:
            while True:
                kind, value = await items.get()
                if kind == "end":
                    ended = True
                    if value is not None:
                        raise value
                    return
                yield value
        finally:
            self._streams.pop(call_id, None)
            if not ended:
                self._send(("cancel", call_id))

    def _send(self, message: tuple) -> None:
        if self.lost or self._link is None:
            raise EngineUnavailableError("the engine process is gone")
        self._link.send(message)

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "state":
            self.state.update(message[1])
        elif kind == "result":
            future = self._calls.get(message[1])
            if future is not None and not future.done():
                ok, value = message[2], message[3]
                future.set_result(value) if ok else future.set_exception(value)
        elif kind == "item":
            items = self._streams.get(message[1])
            if items is not None:
                items.put_nowait(("item", message[2]))
        elif kind == "end":
            items = self._streams.get(message[1])
            if items is not None:
                items.put_nowait(("end", None if message[2] else message[3]))

    def _closed(self) -> None:
        self.lost = True
        gone = EngineUnavailableError("the engine process is gone")
        for future in self._calls.values():
            if not future.done():
                future.set_exception(gone)
        for items in self._streams.values():
            items.put_nowait(("end", gone))
        if self._on_lost is not None:
            self._on_lost()

    def close(self) -> None:
        """Leave (the host cancels what this client still has open); `on_lost` is not called."""
        self._on_lost = None
        if self._link is not None:
            self._link.close()
