"""One WebSocket of WS /v1/realtime: client events in, server events out.

The session owns the input audio buffer, the conversation, the server VAD and at most
one running response (`ResponseRun`). Client events are handled one at a time, in
order; a response runs as its own task, so audio keeps arriving (and barge-in is heard)
while the model answers. A bad event gets an `error` event naming the field, and the
session goes on.

Limits (server settings): the session's length, the audio waiting in the input buffer,
and the time without a client event while no response runs. Each ends the session with
an `error` event, then a close code: 1008 (policy) for time limits, 1009 (too big) for
the buffer. A server that stops closes open sessions with 1001 (going away).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from omnistage.entrypoints.openai.common import event_object, typed_event
from omnistage.entrypoints.openai.engine_client import EngineGateway
from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.entrypoints.openai.realtime import audio_format
from omnistage.entrypoints.openai.prefix_warmer import PrefixWarmer
from omnistage.entrypoints.openai.realtime.conversation import Conversation, Item, Part, audio_parts, new_id
from omnistage.entrypoints.openai.realtime.input_transcription import heard_transcript, transcribe
from omnistage.entrypoints.openai.realtime.protocol import (
    EVENTS,
    BufferAppend,
    BufferClear,
    BufferCommit,
    ClientEvent,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    ResponseCancel,
    ResponseCreate,
    SessionSettings,
    SessionUpdate,
)
from omnistage.entrypoints.openai.realtime.reference_variant import (
    INPUT_RATE,
    ReferenceVariant,
    error_event,
    is_reference_event,
)
from omnistage.entrypoints.openai.realtime.response import ResponseRun
from omnistage.entrypoints.openai.realtime.turn_prefill import TurnCuts
from omnistage.entrypoints.openai.realtime.vad import VAD_RATE, SileroDetector, TurnDetector
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.ws_session import MESSAGE_TOO_BIG, EventSession, SessionLimit
from omnistage.media.audio import resample

MIN_COMMIT_MS = 100  # OpenAI refuses to commit less than 100 ms of audio
TRIM_MARGIN_MS = 500  # kept beyond the prefix padding: the VAD lags the buffer by up to a window


class RealtimeSession(EventSession):
    def __init__(self, websocket: WebSocket, gateway: EngineGateway, settings: ServerSettings, model: str,
                 detector_factory: Any = SileroDetector, capabilities: dict[str, Any] | None = None):
        super().__init__(websocket, gateway, settings)
        self.capabilities = capabilities
        """Shown in the session object when the client asked for a duplex session (`?duplex=1`) and
        got this turn-based one instead (serving.py)."""
        self.settings = SessionSettings(model=model)
        self.detector_factory = detector_factory
        self.conversation = Conversation()
        self.response: ResponseRun | None = None
        self._buffer: list[np.ndarray] = []
        self._buffer_start = 0  # session sample (at the input rate) where the buffer begins
        self._num_samples = 0  # input samples appended over the whole session
        self._detector: Any = None
        self._turns: TurnDetector | None = None
        self._turns_offset_ms = 0  # session time at which the turn detector started
        self._speech_item_id: str | None = None
        self._speech_start = 0
        self._transcriptions: set[asyncio.Task] = set()
        self._truncations: set[asyncio.Task] = set()  # transcribing what was heard of truncated answers
        self.variant: ReferenceVariant | None = None
        """Set once the client speaks the reference system's variant (reference_variant.py)."""
        self.warmer = PrefixWarmer(gateway, gateway.engine.spec.entry_stages[0].name, settings.realtime_prefill,
                                   session_id=self.id)
        self._cuts = TurnCuts()  # where the turn being spoken is cut into clips (turn_prefill.py)

    async def _cleanup(self) -> None:
        if self.response is not None:
            self.response.cancel("client_cancelled")  # the client is gone: abort the engine request
            await asyncio.gather(self.response.task, return_exceptions=True)
        await self.warmer.close()
        variant = [self.variant.task] if self.variant and self.variant.task else []
        tasks = [*self._transcriptions, *self._truncations, *variant]
        for task in tasks:
            task.cancel()  # each closes its engine stream, which aborts the request
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _session(self) -> None:
        try:
            await self._send({"type": "session.created", "session": self._session_object()})
            while True:
                event = await self._next_event()
                if event is not None:
                    await self._handle(event)
        except SessionLimit as limit:
            await self._end(limit)
        except (WebSocketDisconnect, RuntimeError):  # the client went away (RuntimeError: sent to a closed socket)
            pass

    # --- client events -------------------------------------------------------------------

    async def _next_event(self) -> ClientEvent | None:
        """The next client event, or None after answering a bad one with an error event."""
        message = await self._receive()
        client_event_id = None
        try:
            raw = event_object(message)
            client_event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
            if self.variant is None and is_reference_event(raw):
                self.variant = ReferenceVariant(self.gateway, self.settings.model, self.conversation, self._send)
            if self.variant is not None:
                await self.variant.handle(raw)
                self._check_buffer(self.variant.buffered(), INPUT_RATE)
                return None
            return typed_event(raw, EVENTS)
        except APIError as e:
            if self.variant is not None:
                await self._send(error_event(e))
            else:
                await self._error(e, client_event_id)
            return None

    def _is_answering(self) -> bool:
        tasks = [self.response.task if self.response else None, self.variant.task if self.variant else None]
        return any(task is not None and not task.done() for task in tasks)

    async def _handle(self, event: ClientEvent) -> None:
        try:
            if isinstance(event, SessionUpdate):
                await self._update(event)
            elif isinstance(event, BufferAppend):
                await self._append(event)
            elif isinstance(event, BufferCommit):
                await self._commit(self._buffered())
            elif isinstance(event, BufferClear):
                self._clear_buffer()
                await self.warmer.close()  # nobody will answer the audio it prefills
                await self._send({"type": "input_audio_buffer.cleared"})
            elif isinstance(event, ItemCreate):
                await self._create_item(event)
            elif isinstance(event, (ItemDelete, ItemRetrieve, ItemTruncate)):
                await self._edit_item(event)
            elif isinstance(event, ResponseCreate):
                await self._start_response(event)
            elif isinstance(event, ResponseCancel):
                await self._cancel(event)
        except APIError as e:
            await self._error(e, event.event_id)

    async def _update(self, event: SessionUpdate) -> None:
        config = event.session
        if config.model is not None and config.model != self.settings.model:
            raise bad_request(f"session.model: this server serves {self.settings.model!r}", param="session.model")
        updated = self.settings.update(config)
        if updated.transcription is not None and updated.transcription.model not in (None, self.settings.model):
            where = ("session.input_audio_transcription.model" if config.input_audio_transcription is not None
                     else "session.audio.input.transcription.model")
            raise bad_request(f"{where}: the served model {self.settings.model!r} transcribes (or leave it out)",
                              param=where)
        if updated.input_format != self.settings.input_format and self._buffer:
            raise bad_request("session.audio.input.format: cannot change while the input audio buffer holds "
                              "audio (clear or commit it first)", param="session.audio.input.format")
        if updated.turn_detection != self.settings.turn_detection:
            self._turns = None  # rebuilt with the new parameters at the next append
            self._cuts.reset()  # the turn's start moves (speech start or buffer start): cut anew
        self.settings = updated
        await self._send({"type": "session.updated", "session": self._session_object()})

    async def _append(self, event: BufferAppend) -> None:
        audio = audio_format.decode_base64(event.audio, self.settings.input_format, "audio")
        rate = audio_format.RATES[self.settings.input_format]
        self._check_buffer(sum(len(a) for a in self._buffer) + len(audio), rate)
        self._buffer.append(audio)
        self._num_samples += len(audio)
        if self.settings.turn_detection is not None:
            for vad in await asyncio.to_thread(self._detect, audio, rate):
                await self._on_vad(vad.kind, vad.ms, rate)
            if self._turns is not None and not self._turns.is_speaking:
                self._drop_silence(rate)
        self._prefill_turn(rate)

    def _prefill_turn(self, rate: int) -> None:
        """While the user speaks, cut their turn into clips and prefill each one (turn_prefill.py):
        from the speech start with server VAD, else from the buffer's start (the next commit)."""
        if not self.warmer.enabled:
            return
        if self.settings.turn_detection is not None:
            if self._speech_item_id is None:  # not speaking
                return
            start = self._speech_start
        else:
            start = self._buffer_start
        if not self._cuts.grow(self._num_samples - start, rate) or self._is_answering():
            return  # (an answer extends the conversation: a later cut's warm-up follows it)
        turn = self._buffered()[start - self._buffer_start:start - self._buffer_start + self._cuts.cuts[-1]]
        clips = audio_parts(turn, rate, tuple(self._cuts.cuts[:-1]))
        self.warmer.warm([*self.conversation.messages(self.settings.instructions),
                          {"role": "user", "content": clips}], "audio" in self.settings.output_modalities)

    def _drop_silence(self, rate: int) -> None:
        """Between turns, keep only the audio a next turn's prefix padding may reach back to: a
        microphone streaming silence must not fill the buffer up to its limit."""
        keep = (self.settings.turn_detection.prefix_padding_ms + TRIM_MARGIN_MS) * rate // 1000
        audio = self._buffered()
        if len(audio) > 2 * keep:  # now and then, not at every append
            self._buffer = [audio[-keep:]]
            self._buffer_start += len(audio) - keep

    def _check_buffer(self, num_samples: int, rate: int) -> None:
        if num_samples > self.limits.realtime_max_buffer_s * rate:
            raise SessionLimit("input_audio_buffer_too_large", "the input audio buffer holds more than "
                               f"{self.limits.realtime_max_buffer_s:g} s of audio", MESSAGE_TOO_BIG)

    def _detect(self, audio: np.ndarray, rate: int) -> list:
        """VAD events in the newly appended audio (in a worker thread: the model is ~1 ms a window)."""
        if self._turns is None:
            if self._detector is None:
                self._detector = self.detector_factory()
            self._detector.reset()
            td = self.settings.turn_detection
            self._turns = TurnDetector(self._detector, td.threshold, td.prefix_padding_ms, td.silence_duration_ms)
            self._turns_offset_ms = (self._num_samples - len(audio)) * 1000 // rate
        events = self._turns.feed(resample(audio, rate, VAD_RATE))
        for event in events:  # the detector counts from its own start; the events use session time
            event.ms += self._turns_offset_ms
        return events

    async def _on_vad(self, kind: str, ms: int, rate: int) -> None:
        td = self.settings.turn_detection
        if kind == "started":
            self._speech_item_id = new_id("item")
            self._speech_start = max(ms * rate // 1000, self._buffer_start)
            self._cuts.reset()
            if td.interrupt_response and self.response is not None and not self.response.task.done():
                self.response.cancel("turn_detected")  # barge-in
            await self._send({"type": "input_audio_buffer.speech_started", "audio_start_ms": ms,
                              "item_id": self._speech_item_id})
            return
        await self._send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": ms,
                          "item_id": self._speech_item_id})
        audio = self._buffered()[max(0, self._speech_start - self._buffer_start):]
        await self._commit(audio, self._speech_item_id)
        self._speech_item_id = None
        if td.create_response:
            if self.response is not None and not self.response.task.done():
                self.response.cancel("turn_detected")
                await asyncio.gather(self.response.task, return_exceptions=True)
            await self._start_response(None)

    def _buffered(self) -> np.ndarray:
        return np.concatenate(self._buffer) if self._buffer else np.zeros(0, dtype=np.float32)

    def _clear_buffer(self) -> None:
        self._buffer = []
        self._buffer_start = self._num_samples
        self._cuts.reset()

    async def _commit(self, audio: np.ndarray, item_id: str | None = None) -> None:
        rate = audio_format.RATES[self.settings.input_format]
        if len(audio) * 1000 < MIN_COMMIT_MS * rate:
            raise bad_request(f"buffer too small: expected at least {MIN_COMMIT_MS} ms of audio, but the buffer "
                              f"holds {len(audio) * 1000 // rate} ms", code="input_audio_buffer_commit_empty")
        audio, cuts = self._cuts.final(audio, rate)
        self._clear_buffer()
        item = Item("user", [Part("input_audio", audio=audio, sample_rate=rate, cuts=cuts)],
                    id=item_id or new_id("item"))
        previous = self.conversation.insert(item)
        await self._send({"type": "input_audio_buffer.committed", "previous_item_id": previous, "item_id": item.id})
        await self._added(item, previous)
        if self.settings.transcription is not None:
            task = asyncio.create_task(self._transcribe(item))
            self._transcriptions.add(task)
            task.add_done_callback(self._transcriptions.discard)

    async def _transcribe(self, item: Item) -> None:
        try:
            await transcribe(self.gateway, item, self.settings.transcription, self._send)
        except (WebSocketDisconnect, RuntimeError):  # the client went away
            pass

    async def _create_item(self, event: ItemCreate) -> None:
        spec = event.item
        if spec.id is not None and self.conversation.has(spec.id):
            raise bad_request(f"item.id: the conversation already has an item {spec.id!r}", param="item.id")
        try:
            index = self.conversation.index_after(event.previous_item_id)
        except KeyError:
            raise bad_request(f"previous_item_id: no item {event.previous_item_id!r} in the conversation",
                              param="previous_item_id") from None
        parts = []
        for j, c in enumerate(spec.content):
            where = f"item.content[{j}]"
            if c.type == "input_audio":
                if spec.role != "user" or c.audio is None:
                    raise bad_request(f"{where}: input_audio is a user part with `audio`", param=where)
                fmt = self.settings.input_format
                audio = audio_format.decode_base64(c.audio, fmt, f"{where}.audio")
                parts.append(Part("input_audio", c.transcript or "", audio, audio_format.RATES[fmt]))
            else:
                if c.text is None:
                    raise bad_request(f"{where}.text: a text part needs text", param=f"{where}.text")
                parts.append(Part("output_text" if spec.role == "assistant" else "input_text", c.text))
        item = Item(spec.role, parts, id=spec.id or new_id("item"))
        await self._added(item, self.conversation.insert(item, index))

    async def _edit_item(self, event: ItemDelete | ItemRetrieve | ItemTruncate) -> None:
        try:
            item = self.conversation.get(event.item_id)
        except KeyError:
            raise bad_request(f"item_id: no item {event.item_id!r} in the conversation", param="item_id") from None
        if isinstance(event, ItemRetrieve):
            await self._send({"type": "conversation.item.retrieved", "item": item.as_openai()})
            return
        if self.response is not None and not self.response.task.done() and self.response.item is item:
            raise bad_request("item_id: the item is being written by the running response", param="item_id")
        if isinstance(event, ItemDelete):
            self.conversation.delete(item.id)
            await self._send({"type": "conversation.item.deleted", "item_id": item.id})
            return
        if item.role != "assistant" or event.content_index >= len(item.parts) or \
                item.parts[event.content_index].type != "output_audio":
            raise bad_request("content_index: truncate names an assistant item's audio part", param="content_index")
        part = item.parts[event.content_index]
        if part.audio is None:
            raise bad_request("item_id: the session keeps the audio of its latest answer only (truncate it after "
                              "a barge-in, before the next response)", param="item_id")
        sent_ms = len(part.audio) * 1000 // part.sample_rate if part.sample_rate else 0
        if event.audio_end_ms > sent_ms:
            raise bad_request(f"audio_end_ms: {event.audio_end_ms} ms is past the end of the item's audio "
                              f"({sent_ms} ms)", param="audio_end_ms")
        # The answer's words are not aligned to its audio: as OpenAI does, the transcript goes at once;
        # then the words of the audio that was heard take its place (the model reads nothing unheard).
        part.audio, part.text = part.audio[:event.audio_end_ms * part.sample_rate // 1000], ""
        if len(part.audio):
            task = asyncio.create_task(heard_transcript(self.gateway, part))
            self._truncations.add(task)
            task.add_done_callback(self._truncations.discard)
        await self._send({"type": "conversation.item.truncated", "item_id": item.id,
                          "content_index": event.content_index, "audio_end_ms": event.audio_end_ms})

    async def _added(self, item: Item, previous: str | None) -> None:
        await self._send({"type": "conversation.item.added", "previous_item_id": previous, "item": item.as_openai()})
        await self._send({"type": "conversation.item.done", "previous_item_id": previous, "item": item.as_openai()})

    async def _start_response(self, event: ResponseCreate | None) -> None:
        if self.response is not None and not self.response.task.done():
            raise bad_request(f"the conversation already has an active response {self.response.id!r}",
                              code="conversation_already_has_active_response")
        if self._truncations:  # the answer reads what was heard of a truncated one
            await asyncio.gather(*self._truncations, return_exceptions=True)
        self.conversation.forget_answer_audio()  # a session's memory stays bounded
        settings = self.settings
        if event is not None and event.response is not None:
            settings = settings.update(event.response)
        self.response = ResponseRun(self.gateway, settings, self.conversation, self._send, self.warmer)
        self.response.start()

    async def _cancel(self, event: ResponseCancel) -> None:
        running = self.response is not None and not self.response.task.done()
        if not running or (event.response_id is not None and event.response_id != self.response.id):
            raise bad_request("there is no active response to cancel" if not running else
                              f"response_id: {event.response_id!r} is not the active response",
                              param=None if not running else "response_id", code="response_cancel_not_active")
        self.response.cancel("client_cancelled")
        await asyncio.gather(self.response.task, return_exceptions=True)

    # --- server events --------------------------------------------------------------------

    def _session_object(self) -> dict[str, Any]:
        extra = {"capabilities": self.capabilities} if self.capabilities is not None else {}
        return {"id": self.id, **self.settings.as_openai(), **extra}
