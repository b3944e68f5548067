"""One full-duplex WebSocket session (WS /v1/realtime?duplex=1, WS /v1/duplex) on a duplex
family (`PipelineSpec.duplex`, e.g. Moshi): the model listens while it speaks.

The session is one engine request, opened with the session: every `input_audio_buffer.append`
goes straight to it (`AsyncOmni.update`), with no commit and no turns, and the model's
speech and its text flow back as they are made, whether or not the user is speaking:

    server: session.created (session.capabilities), response.created, then continuously
            response.output_audio.delta (base64 PCM16, 24 kHz) and
            response.output_audio_transcript.delta; response.done and session.closed at the end
    client: input_audio_buffer.append (base64 PCM16 at the model's rate), session.update /
            session.create (model only), session.close

The model's steps wait for the user's audio (one step per 80 ms frame heard), so the
client's audio paces the reply. The socket's life, limits and error events are the shared
`EventSession`'s (ws_session.py); a limit's `error` event is followed here by response.done
and session.closed, then the close code. The session ends on session.close, at a limit, when
the engine request ends (it reached max_model_len) or when the client goes away; each closes
the engine stream, which aborts the request and frees its slot in the model's batch.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from omnistage.config import Duplex
from omnistage.entrypoints.openai.audio.stream import GOING_AWAY
from omnistage.entrypoints.openai.common import event_object, typed_event
from omnistage.entrypoints.openai.engine_client import EngineGateway
from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.entrypoints.openai.realtime import audio_format
from omnistage.entrypoints.openai.realtime.conversation import new_id
from omnistage.entrypoints.openai.realtime.protocol import DUPLEX_EVENTS, BufferAppend, SessionClose
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.text_generation import entry_sampling_params
from omnistage.entrypoints.openai.ws_session import EventSession, SessionLimit

FORMAT = "audio/pcm"  # 16-bit PCM; its rate is the model's (checked at the route)
CLOSE_REASONS = {"session_expired": "timeout", "idle_timeout": "idle_timeout"}
"""session.closed's `reason` for a limit's code (the reference's names where it has one)."""


def capabilities(duplex: Duplex | None) -> dict[str, Any]:
    """What a session does, in `session.created.session.capabilities` (the reference's fields):
    a duplex session needs no commit and has no turns to barge into; a turn-based one is
    driven by commits (or the server's VAD) and a new turn interrupts the answer."""
    return {"duplex": duplex is not None, "supports_client_commit": duplex is None,
            "supports_barge_in": duplex is None, "supports_session_resume": False,
            "supports_multi_session": True, "chunk_period_ms": duplex.frame_ms if duplex is not None else None}


class DuplexSession(EventSession):
    def __init__(self, websocket: WebSocket, gateway: EngineGateway, settings: ServerSettings, model: str,
                 duplex: Duplex):
        super().__init__(websocket, gateway, settings)
        self.model = model
        self.duplex = duplex
        self.response_id = new_id("resp")
        self.item_id = new_id("item")
        self._stream: Any = None
        self._outputs: asyncio.Task | None = None
        self._pending: list[np.ndarray] = []  # audio heard before the engine request is known to run
        self._is_live = False  # the request has answered: audio goes straight to it
        self._close_reason = "disconnect"
        self._failure: dict[str, Any] | None = None
        self._is_closed = False  # response.done and session.closed are sent

    async def _session(self) -> None:
        try:
            await self._send({"type": "session.created", "session": self._session_object()})
            await self._send({"type": "response.created", "response": self._response("in_progress")})
            while True:
                event = await self._next_event()
                if isinstance(event, SessionClose):
                    self._close_reason = "client_close"
                    return
                if self._outputs is not None and self._outputs.done():  # the request ended (max_model_len)
                    return
        except SessionLimit as limit:
            await self._end(limit)
        except (WebSocketDisconnect, RuntimeError):  # the client went away (RuntimeError: sent to a closed socket)
            pass

    def _is_answering(self) -> bool:
        return False  # the model's steps wait for the client's audio: a silent client is an idle one

    async def _cleanup(self) -> None:
        if self._outputs is not None:
            self._outputs.cancel()
            await asyncio.gather(self._outputs, return_exceptions=True)
        if self._stream is not None:
            await self._stream.close()  # aborts the engine request: its batch slot is free again
        await self._say_closed()
        await self._close(1000, self._close_reason)

    # --- the client's events ------------------------------------------------------------------

    async def _next_event(self) -> Any:
        """The next client event, handled; a bad one gets an error event. Returns when the engine
        request ends too (the outputs task wakes the read), so the session ends with it."""
        receive = asyncio.ensure_future(self._receive())
        waits = {receive, *([self._outputs] if self._outputs is not None else [])}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not receive.done():
                receive.cancel()
                await asyncio.gather(receive, return_exceptions=True)
        if receive.cancelled():
            return None
        message = receive.result()
        raw: dict[str, Any] = {}
        try:
            raw = event_object(message)
            event = typed_event(raw, DUPLEX_EVENTS)
            if isinstance(event, BufferAppend):
                await self._hear(audio_format.decode_base64(event.audio, FORMAT, "audio"))
            elif not isinstance(event, SessionClose):  # session.update / session.create
                if event.session is not None and event.session.model not in (None, self.model):
                    raise bad_request(f"session.model: this server serves {self.model!r}", param="session.model")
                await self._send({"type": "session.updated", "session": self._session_object()})
            return event
        except APIError as e:
            await self._error(e, raw.get("event_id") if isinstance(raw.get("event_id"), str) else None)
            return None

    # --- the model's input and output ------------------------------------------------------------

    def _start(self, audio: np.ndarray) -> None:
        """Open the engine request with the audio heard so far (at least one frame) as its prompt."""
        # The entry stage's sampling: its deploy defaults, and no length (SamplingParams' 16 tokens
        # would end the session after 1.3 s): it runs until the session ends, or max_model_len.
        entry = self.gateway.engine.spec.entry_stages[0].name
        params = {entry: entry_sampling_params({}, {}, fallback={"max_tokens": None}), **self.duplex.params()}
        self._stream = self.gateway.submit(self.duplex.inputs(audio, False), params, self.response_id,
                                           ("text", "audio"), session_id=self.id)
        self._outputs = asyncio.create_task(self._forward_outputs())

    async def _hear(self, audio: np.ndarray) -> None:
        """The client's audio to the model. An update reaches only a request the engine already
        runs, and `AsyncOmni.generate` submits on its first pull, so the request opens with
        the first frame as its prompt, and audio waits here until its first output (that
        frame's speech, one step later) shows the request runs."""
        if self._is_live:
            await self.gateway.engine.update(self._stream.request_id, self.duplex.inputs(audio, False))
            return
        self._pending.append(audio)
        frame = round(self.duplex.sample_rate * self.duplex.frame_ms / 1000)
        if self._stream is None and sum(len(a) for a in self._pending) >= frame:
            audio, self._pending = np.concatenate(self._pending), []
            self._start(audio)

    async def _go_live(self) -> None:
        self._is_live = True
        if self._pending:
            audio, self._pending = np.concatenate(self._pending), []
            await self.gateway.engine.update(self._stream.request_id, self.duplex.inputs(audio, False))

    async def _forward_outputs(self) -> None:
        try:
            async for out in self._stream:
                if not self._is_live:
                    await self._go_live()
                if out.text_delta:
                    await self._send({**self._where(), "type": "response.output_audio_transcript.delta",
                                      "delta": out.text_delta})
                if out.audio_chunk is not None and len(out.audio_chunk):
                    data = audio_format.encode(out.audio_chunk, out.sample_rate, FORMAT)
                    await self._send({**self._where(), "type": "response.output_audio.delta",
                                      "delta": base64.b64encode(data).decode()})
            self._close_reason = "max_model_len"
        except APIError as e:
            self._failure = {"type": e.type, "code": e.code, "message": e.message}
            self._close_reason = "error"
        except (WebSocketDisconnect, RuntimeError):  # the client went away
            pass

    # --- server events --------------------------------------------------------------------------

    async def _end(self, limit: SessionLimit) -> None:
        self._close_reason = CLOSE_REASONS.get(limit.code, limit.code)
        await super()._end(limit)

    async def _close(self, code: int, reason: str) -> None:
        """Every close the server makes says first how the response and the session ended."""
        if code == GOING_AWAY:
            self._close_reason = "shutdown"
        await self._say_closed()
        await super()._close(code, reason)

    async def _say_closed(self) -> None:
        """response.done (completed: the request ran to max_model_len; cancelled: the session
        ended it; failed), then session.closed with the reason; once."""
        if self._is_closed:
            return
        self._is_closed = True
        if self._failure is not None:
            status, details = "failed", {"type": "failed", "error": self._failure}
        elif self._close_reason == "max_model_len":
            status, details = "completed", None
        else:
            status, details = "cancelled", {"type": "cancelled", "reason": self._close_reason}
        try:
            await self._send({"type": "response.done", "response": self._response(status, details)})
            await self._send({"type": "session.closed", "reason": self._close_reason})
        except (WebSocketDisconnect, RuntimeError):  # already gone
            pass

    def _session_object(self) -> dict[str, Any]:
        rate = self.duplex.sample_rate
        fmt = {"type": FORMAT, "rate": rate}
        return {"id": self.id, "object": "realtime.session", "type": "realtime", "model": self.model,
                "output_modalities": ["audio"], "audio": {"input": {"format": fmt, "turn_detection": None},
                                                          "output": {"format": fmt}},
                "capabilities": capabilities(self.duplex)}

    def _where(self) -> dict[str, Any]:
        return {"response_id": self.response_id, "item_id": self.item_id, "output_index": 0, "content_index": 0}

    def _response(self, status: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"id": self.response_id, "object": "realtime.response", "status": status, "status_details": details,
                "output_modalities": ["audio"]}
