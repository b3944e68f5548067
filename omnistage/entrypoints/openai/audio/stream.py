"""WS /v1/audio/speech/stream: text in as it is written, speech out sentence by sentence.

Client -> server (JSON text messages):

    {"type": "session.config", "voice": ..., "response_format": "pcm" | "wav", "speed": ..., ...}
    {"type": "input.text", "text": "Hello there. How"}     any number, any split
    {"type": "input.done"}                                   no more text: finish and close

Server -> client, for each sentence in order:

    {"type": "audio.start", "sentence_index", "sentence_text", "format", "sample_rate", "channels"}
    binary frames: PCM16 mono (with "wav", the first frame starts with a streaming WAV header)
    {"type": "audio.done", "sentence_index", "total_bytes", "error"}   error: null, or why it failed

and at the end `{"type": "session.done", "total_sentences"}`. A message the server cannot
use (not JSON, binary, unknown type, bad field, a config after text) is answered with
`{"type": "error", "message", "param", "code"}` and the session goes on.

Text is split at sentence ends (`SentenceSplitter`) as it arrives, so the first
sentence is spoken while the client is still writing. Each sentence is one speech
request (`SpeechServing.start`); up to `MAX_AHEAD` of them run at once (the engine
batches them) and their audio is sent in order.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import numpy as np
from pydantic import TypeAdapter, ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from omnistage.entrypoints.openai import json_body
from omnistage.entrypoints.openai.audio.protocol import (
    ClientMessage,
    InputDone,
    InputText,
    SessionConfig,
    SpeechRequest,
)
from omnistage.entrypoints.openai.audio.serving import SpeechServing, audio_chunks, refuse_word_timestamps
from omnistage.entrypoints.openai.common import check_model
from omnistage.entrypoints.openai.errors import APIError, bad_request, from_validation_errors, shutting_down
from omnistage.media.audio import StreamingAudioEncoder, change_speed

MAX_SENTENCE_CHARS = 4096  # SpeechRequest.input's limit
MAX_AHEAD = 2
GOING_AWAY = 1001
"""The close code a session gets when the server stops (RFC 6455: the endpoint is going away)."""
_MESSAGE = TypeAdapter(ClientMessage)
# A sentence ends at . ! ? or an ellipsis (then optional closing quotes/brackets) before
# whitespace, or at CJK full stops, which take no space after them.
_SENTENCE_END = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019)\]]*\s+|[\u3002\uff01\uff1f]+")


class SentenceSplitter:
    """Complete sentences out of text that arrives in pieces."""

    def __init__(self, max_chars: int = MAX_SENTENCE_CHARS):
        self.max_chars = max_chars
        self._buffer = ""

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        sentences = []
        while True:
            match = _SENTENCE_END.search(self._buffer)
            if match is None or match.end() > self.max_chars:
                break
            sentences.append(self._buffer[:match.end()])
            self._buffer = self._buffer[match.end():]
        while len(self._buffer) > self.max_chars:  # no sentence end in sight: cut at a space
            cut = self._buffer.rfind(" ", 0, self.max_chars) + 1 or self.max_chars
            sentences.append(self._buffer[:cut])
            self._buffer = self._buffer[cut:]
        return [s.strip() for s in sentences if s.strip()]

    def flush(self) -> list[str]:
        rest, self._buffer = self._buffer.strip(), ""
        return [rest] if rest else []


class SpeechStreamSession:
    def __init__(self, websocket: WebSocket, handler: SpeechServing):
        self.ws = websocket
        self.handler = handler
        self.config = SessionConfig(type="session.config")
        self.splitter = SentenceSplitter()
        self._send_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(MAX_AHEAD)
        self._sentences: asyncio.Queue = asyncio.Queue()  # (index, text, start task), then None
        self._started: list[asyncio.Task] = []
        self._num_sentences = 0
        self._got_text = False

    async def run(self) -> None:
        await self.ws.accept()
        session = asyncio.create_task(self._session())
        drained = self.handler.gateway.drained
        await asyncio.wait({session, drained}, return_when=asyncio.FIRST_COMPLETED)
        if not session.done():  # the server is stopping: say so with the close, not a cut connection
            session.cancel()
            await asyncio.gather(session, return_exceptions=True)
            try:
                await self.ws.close(code=GOING_AWAY, reason=shutting_down().message[:120])
            except RuntimeError:  # already closed
                pass

    async def _session(self) -> None:
        sender = asyncio.create_task(self._send_sentences())
        try:
            await self._receive_text()
            await self._sentences.put(None)
            await sender
            await self._send_json({"type": "session.done", "total_sentences": self._num_sentences})
            await self.ws.close()
        except (WebSocketDisconnect, RuntimeError):  # the client went away (RuntimeError: sent to a closed socket)
            pass
        finally:
            sender.cancel()
            await self._drop_started()

    # --- client messages -----------------------------------------------------------------

    async def _receive_text(self) -> None:
        """Read messages until input.done, queueing each complete sentence."""
        while True:
            message = await self._next_message()
            if isinstance(message, InputDone):
                for sentence in self.splitter.flush():
                    self._queue(sentence)
                return
            if isinstance(message, InputText):
                self._got_text = True
                for sentence in self.splitter.feed(message.text):
                    self._queue(sentence)
            elif isinstance(message, SessionConfig):
                await self._configure(message)

    async def _next_message(self) -> Any:
        """The next message the session can use; anything else gets an error event."""
        while True:
            event = await self.ws.receive()
            if event["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(event.get("code", 1000))
            try:
                if event.get("text") is None:
                    raise bad_request("binary messages are not accepted; send JSON text messages",
                                      code="invalid_message")
                try:
                    return _MESSAGE.validate_python(json_body.loads(event["text"]))
                except json_body.BadJSON as e:
                    raise bad_request(e.message.replace("the request body", "the message"), param=e.param,
                                      code="invalid_message") from None
                except ValidationError as e:
                    raise from_validation_errors(e.errors()) from None
            except APIError as e:
                await self._send_json(_error_event(e))

    async def _configure(self, config: SessionConfig) -> None:
        try:
            if self._got_text:
                raise bad_request("session.config must come before the first input.text", code="invalid_message")
            check_model(config.model, self.handler.settings)
            refuse_word_timestamps(config.word_timestamps)
            self.handler.voices.prompt_fields(config.voice)  # an unknown voice is an error now, not per sentence
        except APIError as e:
            await self._send_json(_error_event(e))
            return
        self.config = config

    def _queue(self, text: str) -> None:
        c = self.config
        request = SpeechRequest(model=c.model, input=text, voice=c.voice, instructions=c.instructions,
                                response_format="pcm", speed=c.speed)
        task = asyncio.create_task(self._start(request))
        self._started.append(task)
        self._sentences.put_nowait((self._num_sentences, text, task))
        self._num_sentences += 1

    async def _start(self, request: SpeechRequest) -> Any:
        await self._slots.acquire()  # released once the sentence is sent; FIFO keeps sentence order
        try:
            return await self.handler.start(request)
        except BaseException:
            self._slots.release()
            raise

    # --- audio out ---------------------------------------------------------------------

    async def _send_sentences(self) -> None:
        while (item := await self._sentences.get()) is not None:
            index, text, task = item
            try:
                stream, first = await task
            except APIError as e:
                await self._send_json({"type": "audio.done", "sentence_index": index, "total_bytes": 0,
                                       "error": e.message})
                continue
            try:
                await self._send_sentence(index, text, stream, first)
            finally:
                await stream.close()
                self._slots.release()

    async def _send_sentence(self, index: int, text: str, stream: Any, first: Any) -> None:
        fmt, rate = self.config.response_format, first.sample_rate
        await self._send_json({"type": "audio.start", "sentence_index": index, "sentence_text": text,
                               "format": fmt, "sample_rate": rate, "channels": 1})
        total, error = 0, None
        try:
            if self.config.speed == 1.0:
                encoder = StreamingAudioEncoder(rate, fmt)
                async for chunk in audio_chunks(stream, first):
                    total += await self._send_bytes(encoder.encode(chunk))
            else:
                pieces = [chunk async for chunk in audio_chunks(stream, first)]
                audio = change_speed(np.concatenate(pieces), self.config.speed)
                total += await self._send_bytes(StreamingAudioEncoder(rate, fmt).encode(audio))
        except APIError as e:
            error = e.message
        await self._send_json({"type": "audio.done", "sentence_index": index, "total_bytes": total,
                               "error": error})

    async def _send_json(self, payload: dict) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(payload, separators=(",", ":")))

    async def _send_bytes(self, data: bytes) -> int:
        async with self._send_lock:
            await self.ws.send_bytes(data)
        return len(data)

    async def _drop_started(self) -> None:
        """Abort the engine requests of sentences that were started but never sent."""
        for task in self._started:
            if not task.done():
                task.cancel()
            elif not task.cancelled() and task.exception() is None:
                stream, _ = task.result()
                await stream.close()


def _error_event(error: APIError) -> dict:
    return {"type": "error", "message": error.message, "param": error.param, "code": error.code}
