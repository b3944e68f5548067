"""The life of a JSON-events WebSocket session (`/v1/realtime`, `/v1/video/chat/stream`).

`EventSession.run` accepts the socket and runs the subclass's `_session` until it ends, the
server drains (close 1001) or the session reaches `--realtime-max-session` (an `error`
event, close 1008); then `_cleanup` aborts whatever the session still runs in the engine.
`_receive` counts the idle limit only while `_is_answering` is false. A `SessionLimit`
raised inside `_session` ends it through `_end`: an `error` event naming the limit, then
the close code it carries.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from omnistage.entrypoints.openai.audio.stream import GOING_AWAY
from omnistage.entrypoints.openai.common import accepted_subprotocol
from omnistage.entrypoints.openai.errors import APIError, shutting_down
from omnistage.entrypoints.openai.realtime.conversation import new_id
from omnistage.entrypoints.openai.settings import ServerSettings

POLICY_VIOLATION, MESSAGE_TOO_BIG = 1008, 1009


class SessionLimit(Exception):
    """A limit that ends the session: the error event's code and message, and the close code."""

    def __init__(self, code: str, message: str, close_code: int = POLICY_VIOLATION):
        super().__init__(message)
        self.code, self.message, self.close_code = code, message, close_code


class EventSession:
    def __init__(self, websocket: WebSocket, gateway: Any, limits: ServerSettings):
        self.ws = websocket
        self.gateway = gateway
        self.limits = limits
        self.id = new_id("sess")
        self._send_lock = asyncio.Lock()

    async def _session(self) -> None:
        raise NotImplementedError

    def _is_answering(self) -> bool:
        raise NotImplementedError

    async def _cleanup(self) -> None:
        """The client is gone (or the session ended): no engine request may outlive it."""
        raise NotImplementedError

    async def run(self) -> None:
        await self.ws.accept(subprotocol=accepted_subprotocol(self.ws))
        session = asyncio.create_task(self._session())
        drained = self.gateway.drained
        expiry = asyncio.ensure_future(asyncio.sleep(self.limits.realtime_max_session_s))
        try:
            await asyncio.wait({session, drained, expiry}, return_when=asyncio.FIRST_COMPLETED)
            if not session.done():
                session.cancel()
                await asyncio.gather(session, return_exceptions=True)
                if drained.done():  # the server is stopping: say so with the close, not a cut connection
                    await self._close(GOING_AWAY, shutting_down().message)
                else:
                    await self._end(SessionLimit("session_expired", "the session reached its maximum length of "
                                                 f"{self.limits.realtime_max_session_s:g} s"))
        finally:
            expiry.cancel()
            await self._cleanup()

    async def _receive(self) -> dict[str, Any]:
        """The next WebSocket message; the idle limit counts only while the session answers nothing."""
        receive = asyncio.ensure_future(self.ws.receive())
        try:
            while True:
                done, _ = await asyncio.wait({receive}, timeout=self.limits.realtime_idle_timeout_s)
                if done:
                    break
                if not self._is_answering():
                    raise SessionLimit("idle_timeout", f"no client event for {self.limits.realtime_idle_timeout_s:g} s")
        finally:
            receive.cancel()
        message = receive.result()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        return message

    async def _send(self, event: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps({"event_id": new_id("event"), **event}, separators=(",", ":")))

    async def _error(self, error: APIError, client_event_id: str | None) -> None:
        await self._send({"type": "error", "error": {"type": error.type, "code": error.code, "message": error.message,
                                                     "param": error.param, "event_id": client_event_id}})

    async def _end(self, limit: SessionLimit) -> None:
        try:
            await self._send({"type": "error", "error": {"type": "invalid_request_error", "code": limit.code,
                                                         "message": limit.message, "param": None, "event_id": None}})
        except (WebSocketDisconnect, RuntimeError):
            return
        await self._close(limit.close_code, limit.message)

    async def _close(self, code: int, reason: str) -> None:
        try:
            await self.ws.close(code=code, reason=reason[:120])
        except RuntimeError:  # already closed
            pass
