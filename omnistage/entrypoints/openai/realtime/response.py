"""One response of a Realtime session: the conversation so far in, one engine request,
the answer out as Realtime events, and the assistant item it leaves in the conversation.

Events, in order (GA names): response.created, response.output_item.added,
conversation.item.added, response.content_part.added; then for audio answers
response.output_audio.delta (base64 in the session's output format) and
response.output_audio_transcript.delta, or response.output_text.delta for text answers;
then the .done of each, response.content_part.done, response.output_item.done,
conversation.item.done and response.done (status, usage).

Cancelling the task (response.cancel, barge-in, the session closing) closes the engine
stream, which aborts the request in the engine: no stage keeps working for a response
nobody reads. The answer then ends with status "cancelled", and its item keeps only
the transcript and the audio sent so far.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from starlette.websockets import WebSocketDisconnect

from omnistage.entrypoints.openai.engine_client import EngineGateway
from omnistage.entrypoints.openai.errors import APIError
from omnistage.entrypoints.openai.prefix_warmer import PrefixWarmer
from omnistage.entrypoints.openai.realtime import audio_format
from omnistage.entrypoints.openai.realtime.conversation import Conversation, Item, Part, new_id
from omnistage.entrypoints.openai.realtime.protocol import SessionSettings
from omnistage.entrypoints.openai.text_generation import (
    cached_tokens,
    completion_tokens,
    entry_sampling_params,
    prompt_tokens,
)

Send = Callable[[dict[str, Any]], Awaitable[None]]


logger = logging.getLogger(__name__)

class ResponseRun:
    def __init__(self, gateway: EngineGateway, settings: SessionSettings, conversation: Conversation, send: Send,
                 warmer: PrefixWarmer | None = None):
        self.gateway = gateway
        self.warmer = warmer
        """The session's incremental prefill (turn_prefill.py): the answer waits for its running warm-up."""
        self.settings = settings
        self.conversation = conversation
        self.send = send
        self.id = new_id("resp")
        self.is_audio = "audio" in settings.output_modalities
        self.item = Item("assistant", [Part("output_audio" if self.is_audio else "output_text")],
                         status="in_progress")
        self.cancel_reason: str | None = None
        self.task: asyncio.Task | None = None
        self._final: Any = None
        self._is_running = False
        # Built now, so a bad request is an error event before anything starts, and before the
        # item joins the conversation: the model answers what came before it.
        self.prompt, self.params = self._request()

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    def cancel(self, reason: str) -> None:
        """Stop the response ("client_cancelled", "turn_detected"); it ends with response.done."""
        if self.task is None or self.task.done() or self.cancel_reason is not None:
            return
        self.cancel_reason = reason
        if self._is_running:  # a task cancelled before its first step would skip response.done
            self.task.cancel()

    # --- the run ---------------------------------------------------------------------------

    async def _run(self) -> None:
        self._is_running = True
        try:
            await self._answer()
        except (WebSocketDisconnect, RuntimeError):  # the client went away (RuntimeError: sent to a closed socket)
            pass

    async def _answer(self) -> None:
        status, details = "completed", None
        try:
            await self.send({"type": "response.created", "response": self._response("in_progress")})
            previous = self.conversation.insert(self.item)
            await self.send({"type": "response.output_item.added", "response_id": self.id, "output_index": 0,
                             "item": self.item.as_openai()})
            await self.send({"type": "conversation.item.added", "previous_item_id": previous,
                             "item": self.item.as_openai()})
            await self.send({**self._where(), "type": "response.content_part.added", "part": self._part()})
            if self.cancel_reason is not None:
                raise asyncio.CancelledError
            if self.warmer is not None:
                await self.warmer.settle()  # a running warm-up computes this prompt's prefix: let it finish
            await self._stream(self.prompt, self.params)
            if self.warmer is not None:
                self.warmer.answered(cached_tokens(self._final, self.gateway.engine.spec.entry_stages[0].name))
            if self._final is not None and self._final.finish_reason == "length":
                status, details = "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        except asyncio.CancelledError:
            status, details = "cancelled", {"type": "cancelled", "reason": self.cancel_reason or "client_cancelled"}
        except APIError as e:
            status = "failed"
            details = {"type": "failed", "error": {"type": e.type, "code": e.code, "message": e.message}}
        except Exception:  # noqa: BLE001 - a bug fails this response, never leaves the session waiting
            logger.exception("realtime response %s failed", self.id)
            status = "failed"
            details = {"type": "failed", "error": {"type": "server_error", "code": "internal_error",
                                                   "message": "the response failed inside the server"}}
        self.item.status = "completed" if status == "completed" else "incomplete"
        await self._finish(status, details)

    def _request(self) -> tuple[dict[str, Any], dict[str, Any]]:
        s = self.settings
        prompt: dict[str, Any] = {"messages": self.conversation.messages(s.instructions)}
        if self.is_audio and s.voice is not None:
            prompt["voice"] = s.voice  # omni models read the voice from the prompt
        values = {"max_tokens": s.max_output_tokens, "temperature": s.temperature}
        # As chat: until the model stops (capped at max_model_len), unless the deploy sets a cap.
        params = entry_sampling_params(values, {}, fallback={"max_tokens": None})
        entry = self.gateway.engine.spec.entry_stages[0].name
        return prompt, {entry: params}

    async def _stream(self, prompt: dict[str, Any], params: dict[str, Any]) -> None:
        wanted = ("text", "audio") if self.is_audio else ("text",)
        session_id = self.warmer.session_id if self.warmer is not None else None  # where its warm-ups went
        stream = self.gateway.submit(prompt, params, self.id, wanted, session_id=session_id)
        part = self.item.parts[0]
        fmt = self.settings.output_format
        sent: list[np.ndarray] = []  # the audio as sent, kept on the item (truncate cuts it to what was heard)
        try:
            async for out in stream:  # closing the stream (cancel, error) aborts the engine request
                if out.text_delta:
                    part.text += out.text_delta
                    kind = "response.output_audio_transcript.delta" if self.is_audio else "response.output_text.delta"
                    await self.send({**self._where(), "type": kind, "delta": out.text_delta})
                if self.is_audio and out.audio_chunk is not None and len(out.audio_chunk):
                    data = audio_format.encode(out.audio_chunk, out.sample_rate, fmt)
                    await self.send({**self._where(), "type": "response.output_audio.delta",
                                     "delta": base64.b64encode(data).decode()})
                    sent.append(out.audio_chunk)
                    part.sample_rate = out.sample_rate
                if out.finished:
                    self._final = out
        finally:
            if self.is_audio:
                part.audio = np.concatenate(sent) if sent else np.zeros(0, np.float32)

    async def _finish(self, status: str, details: dict[str, Any] | None) -> None:
        text = self.item.parts[0].text
        if self.is_audio:
            await self.send({**self._where(), "type": "response.output_audio.done"})
            await self.send({**self._where(), "type": "response.output_audio_transcript.done", "transcript": text})
        else:
            await self.send({**self._where(), "type": "response.output_text.done", "text": text})
        await self.send({**self._where(), "type": "response.content_part.done", "part": self._part()})
        item = self.item.as_openai()
        await self.send({"type": "response.output_item.done", "response_id": self.id, "output_index": 0,
                         "item": item})
        await self.send({"type": "conversation.item.done", "item": item})
        await self.send({"type": "response.done", "response": self._response(status, details)})

    # --- shapes ----------------------------------------------------------------------------

    def _where(self) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item.id, "output_index": 0, "content_index": 0}

    def _part(self) -> dict[str, Any]:
        text = self.item.parts[0].text
        return {"type": "audio", "transcript": text} if self.is_audio else {"type": "text", "text": text}

    def _response(self, status: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
        s = self.settings
        done = status != "in_progress"
        usage = None
        if done:
            prompt, completion = prompt_tokens(self._final), completion_tokens(self._final)
            # Audio turns hit the prefix cache too: blocks over a clip key it by its digest
            # (ar/media_spans.py), so an earlier turn's audio counts once the conversation repeats it.
            cached = cached_tokens(self._final, self.gateway.engine.spec.entry_stages[0].name)
            usage = {"total_tokens": prompt + completion, "input_tokens": prompt, "output_tokens": completion,
                     "input_token_details": {"cached_tokens": cached}, "output_token_details": {}}
        return {"id": self.id, "object": "realtime.response", "status": status, "status_details": details,
                "output": [self.item.as_openai()] if done else [], "conversation_id": None,
                "output_modalities": list(s.output_modalities), "max_output_tokens": s.max_output_tokens or "inf",
                "audio": {"output": {"format": s.as_openai()["audio"]["output"]["format"], "voice": s.voice}},
                "usage": usage, "metadata": None}
