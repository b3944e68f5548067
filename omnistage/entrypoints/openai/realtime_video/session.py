"""WS /v1/realtime/video: one video generation per session, streamed as fragmented MP4.

Client -> server (JSON text messages, protocol.py):

    {"type": "session.start", "prompt", "size" | "width"/"height", "fps", "num_frames", "format": "m4s", ...}
    {"type": "session.interaction", "interaction": {"event_id", "event": {"prompt"}, "transition_chunks"}}
    {"type": "session.ping"}
    {"type": "session.stop"}

Server -> client:

    {"type": "video.start", "request_id", "format": "m4s", "mime_type", "width", "height", "fps", "num_frames"}
    per chunk: {"type": "video.chunk_metadata", "kind": "media", "transport_chunk_index",
                "generation_chunk_index", "num_frames", "byte_length", "started_event_ids",
                "active_event_ids", "completed_event_ids"}
               then one binary frame: the chunk's fMP4 fragment (the first one led by the init segment)
    {"type": "session.interaction.queued", "event_id"}
    {"type": "session.pong"}
    {"type": "session.done", "total_chunks", "reason": "completed" | "stopped" | "error"}
    {"type": "error", "message", "param", "code"}

A model that makes its video in chunks (Helios) sends each chunk as soon as it is denoised
and decoded; any other video model sends its whole video as one chunk at the end. The
concatenated binary frames are one valid MP4. `session.stop` aborts the engine request (it
stops within one denoising step) and ends the session. A message the server cannot use (not
JSON, binary, unknown type, a bad field, a second start) is answered with an `error` event
naming the field, and the session goes on; a request the engine refuses (a bad size for the
model) is such an error too, and the client may start again.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from omnistage.entrypoints.openai import json_body
from omnistage.entrypoints.openai.common import accepted_subprotocol, check_model
from omnistage.entrypoints.openai.engine_client import EngineGateway, RequestStream
from omnistage.entrypoints.openai.errors import APIError, bad_request, from_validation_errors, shutting_down
from omnistage.entrypoints.openai.realtime_video.protocol import (
    ClientMessage,
    SessionInteraction,
    SessionPing,
    SessionStart,
    SessionStop,
)
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.videos.serving import form_params, video_params
from omnistage.media.fmp4 import FragmentedMP4Encoder

GOING_AWAY = 1001
"""The close code a session gets when the server stops (RFC 6455: the endpoint is going away)."""
MIME_TYPE = "video/mp4"
_MESSAGE = TypeAdapter(ClientMessage)
_TYPES = {"session.start", "session.interaction", "session.ping", "session.stop"}


class VideoStreamSession:
    def __init__(self, websocket: WebSocket, gateway: EngineGateway, settings: ServerSettings,
                 takes_prompt_updates: bool):
        self.ws = websocket
        self.gateway = gateway
        self.settings = settings
        self.takes_prompt_updates = takes_prompt_updates
        self._events: dict[str, dict] = {}  # event_id -> its interaction, as applied
        self._send_lock = asyncio.Lock()
        self._messages: asyncio.Queue = asyncio.Queue()  # usable client messages, in order
        self._stream: RequestStream | None = None
        self._num_chunks = 0

    async def run(self) -> None:
        # A browser that offers subprotocols (its API key goes as one) fails unless one is picked.
        await self.ws.accept(subprotocol=accepted_subprotocol(self.ws))
        session = asyncio.create_task(self._session())
        drained = self.gateway.drained
        await asyncio.wait({session, drained}, return_when=asyncio.FIRST_COMPLETED)
        if not session.done():  # the server is stopping: say so with the close, not a cut connection
            session.cancel()
            await asyncio.gather(session, return_exceptions=True)
            try:
                await self.ws.close(code=GOING_AWAY, reason=shutting_down().message[:120])
            except RuntimeError:  # already closed
                pass

    async def _session(self) -> None:
        reader = asyncio.create_task(self._read())
        producer: asyncio.Task | None = None
        try:
            start = await self._wait_start()
            if start is None:  # stopped before it started
                return await self._done("stopped")
            producer = asyncio.create_task(self._produce(start))
            while True:
                message = asyncio.create_task(self._next())  # raises WebSocketDisconnect: the finally aborts
                await asyncio.wait({producer, message}, return_when=asyncio.FIRST_COMPLETED)
                if not message.done():
                    message.cancel()
                    break
                if isinstance(message.result(), SessionStop):
                    producer.cancel()
                    await asyncio.gather(producer, return_exceptions=True)
                    await self._close_stream()  # aborts the engine request
                    return await self._done("stopped")
                await self._handle(message.result())
            reason = await producer
            await self._done(reason)
        except (WebSocketDisconnect, RuntimeError):  # the client went away (RuntimeError: sent to a closed socket)
            pass
        finally:
            reader.cancel()
            if producer is not None:
                producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)
            await self._close_stream()

    # --- client messages -----------------------------------------------------------------

    async def _read(self) -> None:
        """Queue every usable client message; a ping is answered here, anything else gets an
        error event (so answers keep the order of the messages). A disconnect is queued as
        itself, so the session sees it in order."""
        while True:
            event = await self.ws.receive()
            if event["type"] == "websocket.disconnect":
                await self._messages.put(WebSocketDisconnect(event.get("code", 1000)))
                return
            try:
                message = _parse(event)
            except APIError as e:
                await self._send_json(_error_event(e))
                continue
            if isinstance(message, SessionPing):
                await self._send_json({"type": "session.pong"})
            else:
                await self._messages.put(message)

    async def _next(self) -> Any:
        message = await self._messages.get()
        if isinstance(message, WebSocketDisconnect):
            raise message
        return message

    async def _wait_start(self) -> SessionStart | None:
        """Until a session.start the engine accepts (its request then runs), or a stop (None)."""
        while True:
            message = await self._next()
            if isinstance(message, SessionStop):
                return None
            if not isinstance(message, SessionStart):
                await self._handle(message)
                continue
            try:
                await self._open(message)
                return message
            except APIError as e:
                await self._send_json(_error_event(e))

    async def _open(self, start: SessionStart) -> None:
        """The engine request of `start`, waiting for its first output (so a refusal is an error event)."""
        if start.model_extra and "preencode_mp4" in start.model_extra:
            raise bad_request("preencode_mp4: this route streams fragmented MP4 (format 'm4s') as it is made; "
                              "there is nothing to pre-encode", param="preencode_mp4")
        check_model(start.model, self.settings)
        params = video_params(start, self.settings)
        request_id = f"video_stream_{uuid.uuid4().hex}"
        with form_params():
            self._stream = await self.gateway.open(start.prompt, params, request_id)

    async def _handle(self, message: Any) -> None:
        """A message that does not start or stop the session."""
        if isinstance(message, SessionStart):
            await self._send_json(_error_event(bad_request("the session has started; one video per session",
                                                           param="type", code="session_already_started")))
        elif isinstance(message, SessionInteraction):
            try:
                await self._interact(message)
            except APIError as e:
                await self._send_json(_error_event(e))

    async def _interact(self, message: SessionInteraction) -> None:
        """Send the prompt update to the running request (from its next chunk on). An event id
        sent again with the same payload is a retry (acknowledged, not applied twice); with
        another payload it is an error."""
        if not self.takes_prompt_updates:
            raise APIError(400, "the active model does not support prompt updates", param="interaction",
                           code="interaction_failed")
        if self._stream is None:
            raise bad_request("session.interaction needs a started session: send session.start first",
                              param="type", code="interaction_failed")
        interaction = message.interaction
        update = {"event_id": interaction.event_id, "prompt": interaction.event.prompt,
                  "transition_chunks": interaction.transition_chunks}
        known = self._events.get(interaction.event_id)
        if known is not None and known != update:
            raise bad_request(f"event_id {interaction.event_id!r} was sent before with another payload",
                              param="interaction.event_id", code="event_id_conflict")
        if known is None:
            self._events[interaction.event_id] = update
            await self.gateway.engine.update(self._stream.request_id, update)
        await self._send_json({"type": "session.interaction.queued", "event_id": interaction.event_id})

    # --- video out -----------------------------------------------------------------------

    async def _produce(self, start: SessionStart) -> str:
        """Send the video chunk by chunk; the reason the session ends ("completed" or "error")."""
        stream = self._stream
        await self._send_json({"type": "video.start", "request_id": stream.request_id, "format": start.format,
                               "mime_type": MIME_TYPE, "width": start.width, "height": start.height,
                               "fps": start.fps, "num_frames": start.num_frames})
        encoder: FragmentedMP4Encoder | None = None
        try:
            async for out in stream:
                events = None
                if out.video_chunk is not None:
                    frames, fps, events = out.video_chunk.frames, out.video_chunk.fps, out.video_chunk.events
                elif out.finished and self._num_chunks == 0 and out.video is not None:
                    frames, fps = out.video, out.fps  # a model that makes its video whole: one chunk at the end
                else:
                    continue
                encoder = encoder or FragmentedMP4Encoder(fps)
                data = await asyncio.to_thread(encoder.encode, frames)
                await self._send_chunk(data, len(frames), events or {})
        except APIError as e:
            await self._send_json(_error_event(e))
            return "error"
        return "completed"

    async def _send_chunk(self, data: bytes, num_frames: int, events: dict[str, list[str]]) -> None:
        index = self._num_chunks
        metadata = {"type": "video.chunk_metadata", "kind": "media", "transport_chunk_index": index,
                    "generation_chunk_index": index, "num_frames": num_frames, "byte_length": len(data),
                    **{f"{what}_event_ids": events.get(what, []) for what in ("started", "active", "completed")}}
        async with self._send_lock:  # the metadata and its bytes stay together
            await self.ws.send_text(json.dumps(metadata, separators=(",", ":")))
            await self.ws.send_bytes(data)
        self._num_chunks += 1

    async def _done(self, reason: str) -> None:
        await self._send_json({"type": "session.done", "total_chunks": self._num_chunks, "reason": reason})
        await self.ws.close()

    async def _close_stream(self) -> None:
        if self._stream is not None:
            await self._stream.close()

    async def _send_json(self, payload: dict) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(payload, separators=(",", ":")))


def _parse(event: dict) -> Any:
    if event.get("text") is None:
        raise bad_request("binary messages are not accepted; send JSON text messages", code="invalid_message")
    try:
        return _MESSAGE.validate_python(json_body.loads(event["text"]))
    except json_body.BadJSON as e:
        raise bad_request(e.message.replace("the request body", "the message"), param=e.param,
                          code="invalid_message") from None
    except ValidationError as e:
        # The field is named within its message ("fps", not "session.start.fps").
        errors = [{**err, "loc": err["loc"][1:]} if err["loc"] and err["loc"][0] in _TYPES else err
                  for err in e.errors()]
        raise from_validation_errors(errors) from None


def _error_event(error: APIError) -> dict:
    return {"type": "error", "message": error.message, "param": error.param, "code": error.code}
