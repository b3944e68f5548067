"""The engine surface the server uses, and the one path every request takes into it.

`EngineClient` is the part of `omnistage.AsyncOmni` the routes call; tests pass any
object with the same surface. `EngineGateway` wraps it with the server's rules:

1. admission: at most `max_queued_requests` requests in the engine; more get 429;
2. the first output is awaited before any answer starts, so a `ValueError` the engine
   raises while checking params (before queueing) becomes a 400, not a broken stream;
3. a request that ends early (client gone, server stopping, error) is aborted in the
   engine, and its admission slot is freed exactly once (by `RequestStream.close`);
4. when the server stops (`drain_after`), open streams end with a 503 the route sends in its
   own error shape (SSE `error` event, WebSocket close) before the connection is cut.

It counts admitted requests and tracks none: which requests a stage holds, and what
happens to them when it dies, is the stage supervisor's (runtime/supervisor.py).
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from starlette.requests import Request

from omnistage.core.errors import EngineUnavailableError, ErrorKind
from omnistage.entrypoints.openai.errors import (
    APIError,
    EngineError,
    bad_request,
    from_value_error,
    shutting_down,
    unavailable,
)
from omnistage.entrypoints.openai.metrics import ServerMetrics


class EngineClient(Protocol):
    """What the server needs from `AsyncOmni`. Optional beyond these: `check` (see
    `EngineGateway.check`), `sync_metrics` (an engine in another process copies its metrics into
    the server's registry before /metrics renders it: remote_engine.py), and the sleep, weights
    and LoRA calls their routes use."""

    spec: Any
    """The resolved PipelineSpec (final stages' output modalities decide the routes)."""

    def generate(self, prompt: Any, params: Any = None, request_id: str | None = None, *,
                 modalities: Sequence[str] | None = None, session_id: str | None = None) -> AsyncIterator[Any]:
        """Yield `OmniOutput`s for one request; the last has finished=True. `modalities`
        (None = all) limits the outputs, and so the stages that run; `session_id` (the
        request's `user`) keeps a session on one replica of stages routed by affinity."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def check_health(self) -> bool: ...

    async def shutdown(self) -> None: ...


def rejection(out: Any) -> APIError | None:
    """The 400 for an output in which a stage refused the request's inputs or params (a typed
    `RequestError` in the engine: its message and field travel as they are), else None."""
    if getattr(out, "error_kind", None) != ErrorKind.INVALID_REQUEST:
        return None
    return bad_request(out.error, param=getattr(out, "error_param", None))


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class RequestStream:
    """One admitted request's outputs, read with `next()` or `async for`.

    It closes itself after the finished output or on any failure; `close()` may be called
    again and aborts the engine request if it has not finished. A `ValueError` before the
    first output is the engine rejecting the request before queueing (400); a stage that
    is down or restarting, or an engine that is stopping, is a 503 with `Retry-After`; any
    other failure is the engine's (500).
    """

    def __init__(self, gateway: EngineGateway, request_id: str, outputs: AsyncIterator[Any]):
        self.gateway = gateway
        self.request_id = request_id
        self._outputs = outputs
        self._peeked: Any = None
        self._started = False
        self._finished = False
        self._closed = False
        self._pulling: asyncio.Future | None = None

    async def start(self) -> Any:
        """Wait for the first output (it stays the next one `next()` returns)."""
        if self._peeked is None and not self._started:
            self._peeked = await self._pull()
        return self._peeked

    async def next(self) -> Any | None:
        """The next output, or None after the finished one."""
        if self._peeked is not None:
            out, self._peeked = self._peeked, None
        elif self._finished or self._closed:
            await self.close()
            return None
        else:
            out = await self._pull()
        if out.finished:
            self._finished = True
        return out

    async def _pull(self) -> Any:
        first = not self._started
        self._started = True
        try:
            out = await self._next_or_drained()
        except ValueError as e:
            await self.close()
            raise (from_value_error(e) if first else EngineError(str(e))) from None
        except EngineUnavailableError as e:
            await self.close()
            raise unavailable(f"the engine takes no requests now: {e}") from None
        except StopAsyncIteration:
            await self.close()
            raise EngineError("the engine ended the request without a final output") from None
        except BaseException:
            await self.close()
            raise
        if out.error:
            self._finished = True  # the engine has already dropped it
            await self.close()
            if getattr(out, "error_kind", None) == ErrorKind.UNAVAILABLE:
                raise unavailable(f"{out.error}; retry later", code="stage_unavailable")
            raise rejection(out) or EngineError(out.error)
        return out

    async def _next_or_drained(self) -> Any:
        """The engine's next output, unless the server's drain deadline comes first (then a 503
        the route's stream ends with, in its own error shape, instead of a cut connection)."""
        drained = self.gateway.drained
        if drained.done():
            raise shutting_down()
        pull = self._pulling = asyncio.ensure_future(self._outputs.__anext__())
        await asyncio.wait({pull, drained}, return_when=asyncio.FIRST_COMPLETED)
        if pull.done():
            return pull.result()
        pull.cancel()
        await asyncio.gather(pull, return_exceptions=True)
        raise shutting_down()

    async def __aiter__(self) -> AsyncIterator[Any]:
        try:
            while (out := await self.next()) is not None:
                yield out
        finally:
            await self.close()

    async def collect(self) -> Any:
        """The finished output (media of every final stage)."""
        last = None
        async for out in self:
            last = out
        return last

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if not self._finished:
                await maybe_await(self.gateway.engine.abort(self.request_id))
            if self._pulling is not None and not self._pulling.done():
                # Cancelled while a pull was in flight: cancelling it ends the generator (its
                # own cleanup runs); aclose() would fail on a generator that is still running.
                self._pulling.cancel()
            elif (aclose := getattr(self._outputs, "aclose", None)) is not None:
                await aclose()
        finally:
            self.gateway.release()


class EngineGateway:
    def __init__(self, engine: Any, max_queued_requests: int, metrics: ServerMetrics):
        self.engine = engine
        self.max_queued_requests = max_queued_requests
        self.metrics = metrics
        self.num_admitted = 0
        self._drained: asyncio.Future | None = None

    @property
    def drained(self) -> asyncio.Future:
        """Done once the server stops and its grace period is nearly over (`drain_after`)."""
        loop = asyncio.get_running_loop()
        if self._drained is None or self._drained.get_loop() is not loop:  # tests may run an app on new loops
            self._drained = loop.create_future()
        return self._drained

    def drain_after(self, seconds: float) -> None:
        """The server is stopping: in `seconds` every open stream ends with a 503 error event
        (call on the event loop, `seconds` before the server cancels what still runs)."""
        asyncio.get_running_loop().call_later(max(0.0, seconds), self._drain)

    def _drain(self) -> None:
        if not self.drained.done():
            self.drained.set_result(None)

    def admit(self) -> None:
        if self.num_admitted >= self.max_queued_requests:
            self.metrics.rejected.labels("queue_full").inc()
            raise APIError(429, f"the server has {self.num_admitted} requests queued or running "
                                f"(limit {self.max_queued_requests}); retry later",
                           code="rate_limit_exceeded", headers={"retry-after": "1"})
        self.num_admitted += 1
        self.metrics.queue_depth.set(self.num_admitted)

    def release(self) -> None:
        self.num_admitted -= 1
        self.metrics.queue_depth.set(self.num_admitted)

    async def require_healthy(self, what: str) -> None:
        """503 with Retry-After while a stage is down or restarting: for work that is accepted
        now and runs later (a video job), which would otherwise only fail once it starts."""
        if self.engine is None or not await maybe_await(self.engine.check_health()):
            raise unavailable(f"{what}: the engine or one of its stages is down or restarting; retry later",
                              code="stage_unavailable")

    async def check(self, prompt: Any, params: Any, request_id: str) -> None:
        """400 naming the field if the engine would refuse the request on arrival: for work that
        is answered before it runs (a video job), which would otherwise only fail later. An
        engine without `check` (test fakes) is asked nothing."""
        check = getattr(self.engine, "check", None)
        if check is None:
            return
        try:
            await maybe_await(check(prompt, params, request_id))
        except ValueError as e:
            raise from_value_error(e) from None

    def submit(self, prompt: Any, params: Any, request_id: str,
               modalities: Sequence[str] | None = None, session_id: str | None = None) -> RequestStream:
        """Admit the request and hand it to the engine (429 when full, 400 when the engine
        rejects it at once). Nothing is awaited: iterate the stream, or `start()` it.
        `modalities` (None = all) are the outputs the request wants."""
        if self.engine is None:
            raise APIError(503, "no engine is loaded", code="engine_unavailable")
        self.admit()
        try:
            outputs = self.engine.generate(prompt, params, request_id=request_id, modalities=modalities,
                                           session_id=session_id)
        except ValueError as e:
            self.release()
            raise from_value_error(e) from None
        except BaseException:
            self.release()
            raise
        return RequestStream(self, request_id, outputs)

    async def open(self, prompt: Any, params: Any, request_id: str,
                   modalities: Sequence[str] | None = None, session_id: str | None = None) -> RequestStream:
        """`submit`, then wait for the first output (so engine rejections are a 400)."""
        stream = self.submit(prompt, params, request_id, modalities, session_id)
        await stream.start()
        return stream

    async def run(self, prompt: Any, params: Any, request_id: str, request: Request | None = None,
                  session_id: str | None = None) -> Any:
        """The finished output of one request; aborted if `request`'s client goes away."""

        async def go() -> Any:
            return await (await self.open(prompt, params, request_id, session_id=session_id)).collect()

        if request is None:
            return await go()
        return await cancel_on_disconnect(request, go())


async def cancel_on_disconnect(request: Request, coro: Any) -> Any:
    """Run `coro`, cancelling it if the client disconnects first (call after the body is read)."""
    task = asyncio.ensure_future(coro)

    async def wait_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass
        raise APIError(499, "the client closed the request", code="client_closed_request")
    return task.result()
