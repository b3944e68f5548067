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
client's audio paces the reply. A bad event gets an `error` event naming the field and the
session goes on. The session ends on session.close, at the session-length limit, when the
engine request ends (it reached max_model_len) or when the client goes away; each closes
the engine stream, which aborts the request and frees its slot in the model's batch.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from typing import Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from omnistage.config import Duplex
from omnistage.entrypoints.openai.common import accepted_subprotocol, event_object
from omnistage.entrypoints.openai.engine_client import EngineGateway
from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.entrypoints.openai.realtime import audio_format
from omnistage.entrypoints.openai.realtime.conversation import new_id
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.text_generation import entry_sampling_params

FORMAT = "audio/pcm"  # 16-bit PCM; its rate is the model's (checked at the route)
CLIENT_EVENTS = ("input_audio_buffer.append", "session.update", "session.create", "session.close")


def capabilities(duplex: Duplex | None) -> dict[str, Any]:
    """What a session does, in `session.created.session.capabilities` (the reference's fields):
    a duplex session needs no commit and has no turns to barge into; a turn-based one is
    driven by commits (or the server's VAD) and a new turn interrupts the answer."""
    return {"duplex": duplex is not None, "supports_client_commit": duplex is None,
            "supports_barge_in": duplex is None, "supports_session_resume": False,
            "supports_multi_session": True, "chunk_period_ms": duplex.frame_ms if duplex is not None else None}


class DuplexSession:
    def __init__(self, websocket: WebSocket, gateway: EngineGateway, settings: ServerSettings, model: str,
                 duplex: Duplex):
        self.ws = websocket
        self.gateway = gateway
        self.limits = settings
        self.model = model
        self.duplex = duplex
        self.id = new_id("sess")
        self.response_id = new_id("resp")
        self.item_id = new_id("item")
        self._send_lock = asyncio.Lock()
        self._stream: Any = None
        self._outputs: asyncio.Task | None = None
        self._ended: asyncio.Future | None = None
        self._pending: list[np.ndarray] = []  # audio heard before the engine request is known to run
        self._is_live = False  # the request has answered: audio goes straight to it
        self._close_reason = "disconnect"
        self._failure: dict[str, Any] | None = None

    async def run(self) -> None:
        await self.ws.accept(subprotocol=accepted_subprotocol(self.ws))
        try:
            await asyncio.wait_for(self._session(), timeout=self.limits.realtime_max_session_s)
        except asyncio.TimeoutError:
            self._close_reason = "timeout"
        except (WebSocketDisconnect, RuntimeError):  # the client went away (RuntimeError: sent to a closed socket)
            pass
        finally:
            if self._stream is not None:
                await self._stream.close()  # aborts the engine request: its batch slot is free again
            await self._closed()

    async def _session(self) -> None:
        await self._send({"type": "session.created", "session": self._session_object()})
        await self._send({"type": "response.created", "response": self._response("in_progress")})
        events = asyncio.create_task(self._read_events())
        self._ended = asyncio.get_running_loop().create_future()  # set when the engine request ends
        try:
            await asyncio.wait({events, self._ended}, return_when=asyncio.FIRST_COMPLETED)
            if events.done():
                events.result()  # a disconnect ends the session here
            elif self._outputs is not None:
                await self._outputs
        finally:
            tasks = [t for t in (events, self._outputs) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _start(self, audio: np.ndarray) -> None:
        """Open the engine request with the audio heard so far (at least one frame) as its prompt."""
        # The entry stage's sampling: its deploy defaults, and no length (SamplingParams' 16 tokens
        # would end the session after 1.3 s): it runs until the session ends, or max_model_len.
        entry = self.gateway.engine.spec.entry_stages[0].name
        params = {entry: entry_sampling_params({}, {}, fallback={"max_tokens": None}), **self.duplex.params()}
        self._stream = self.gateway.submit(self.duplex.inputs(audio, False), params, self.response_id,
                                           ("text", "audio"), session_id=self.id)
        self._outputs = asyncio.create_task(self._forward_outputs())
        self._outputs.add_done_callback(lambda _: self._ended.done() or self._ended.set_result(None))

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

    # --- the model's output ------------------------------------------------------------------

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

    # --- the client's events ------------------------------------------------------------------

    async def _read_events(self) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            event_id = None
            try:
                event = self._parse(message)
                event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
                if event["type"] == "session.close":
                    self._close_reason = "client_close"
                    return
                await self._handle(event)
            except APIError as e:
                await self._error(e, event_id)

    def _parse(self, message: dict[str, Any]) -> dict[str, Any]:
        event = event_object(message)
        if event.get("type") not in CLIENT_EVENTS:
            raise bad_request(f"type: unknown event type {event.get('type')!r} in a duplex session; one of "
                              f"{list(CLIENT_EVENTS)} (no commit: the model hears the audio as it comes)",
                              param="type", code="invalid_event")
        return event

    async def _handle(self, event: dict[str, Any]) -> None:
        if event["type"] == "input_audio_buffer.append":
            audio = event.get("audio")
            if not isinstance(audio, str):
                raise bad_request("audio: a base64 string of PCM16 audio is required", param="audio")
            try:
                samples = audio_format.decode(base64.b64decode(audio, validate=True), FORMAT)
            except (binascii.Error, ValueError) as e:
                raise bad_request(f"audio: not base64 PCM16 audio ({e})", param="audio") from None
            await self._hear(samples)
            return
        session = event.get("session") or {}  # session.update / session.create
        if not isinstance(session, dict):
            raise bad_request("session: must be an object", param="session")
        unknown = sorted(set(session) - {"model", "type"})
        if unknown:
            raise bad_request(f"session.{unknown[0]}: a duplex session's settings are fixed (its model hears "
                              f"and speaks {FORMAT} at {self.duplex.sample_rate} Hz)", param=f"session.{unknown[0]}")
        if session.get("model") not in (None, self.model):
            raise bad_request(f"session.model: this server serves {self.model!r}", param="session.model")
        await self._send({"type": "session.updated", "session": self._session_object()})

    # --- server events --------------------------------------------------------------------------

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

    async def _send(self, event: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps({"event_id": new_id("event"), **event}, separators=(",", ":")))

    async def _error(self, error: APIError, client_event_id: str | None) -> None:
        await self._send({"type": "error", "error": {"type": error.type, "code": error.code, "message": error.message,
                                                     "param": error.param, "event_id": client_event_id}})

    async def _closed(self) -> None:
        """response.done (completed: the request ran to max_model_len; cancelled: the session
        ended it; failed), then session.closed with the reason."""
        if self._failure is not None:
            status, details = "failed", {"type": "failed", "error": self._failure}
        elif self._close_reason == "max_model_len":
            status, details = "completed", None
        else:
            status, details = "cancelled", {"type": "cancelled", "reason": self._close_reason}
        try:
            await self._send({"type": "response.done", "response": self._response(status, details)})
            await self._send({"type": "session.closed", "reason": self._close_reason})
            await self.ws.close()
        except (WebSocketDisconnect, RuntimeError):  # already gone
            pass
