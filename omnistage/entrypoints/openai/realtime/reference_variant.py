"""The reference system's own /v1/realtime variant (vLLM's, as vLLM-Omni extends it for
omni models), so clients written for it keep working on this route:

    client: {"type": "session.update", "model": ...}                  (no `session` object)
            {"type": "input_audio_buffer.commit", "final": false}      a turn starts
            {"type": "input_audio_buffer.append", "audio": ...}        base64 PCM16, 16 kHz mono
            {"type": "input_audio_buffer.commit", "final": true}       the input is complete
    server: {"type": "transcription.delta", "delta"}                   the model's words as they come
            {"type": "transcription.done", "text", "usage"}
            {"type": "response.audio.delta", "audio", "format": "pcm16", "sample_rate_hz"}
            {"type": "response.audio.done", "has_audio"}
            {"type": "error", "error", "code"}

A session speaks it from the first event only it has: a commit carrying `final`, or a
session.update with `model` and no `session`. The answer starts at `final: true`: the
reference starts generating at `final: false` over the incoming stream, which needs
streamed input into the thinker, not done here (the audio is buffered until then). The
turns join the session's conversation, so a second turn hears the first.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np

from omnistage.entrypoints.openai.engine_client import EngineGateway
from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.entrypoints.openai.realtime import audio_format
from omnistage.entrypoints.openai.realtime.conversation import Conversation, Item, Part, new_id
from omnistage.entrypoints.openai.realtime.response import Send
from omnistage.entrypoints.openai.text_generation import completion_tokens, entry_sampling_params, prompt_tokens

INPUT_RATE = 16000
OUTPUT_RATE = 24000


def is_reference_event(raw: dict[str, Any]) -> bool:
    kind = raw.get("type")
    return (kind == "input_audio_buffer.commit" and "final" in raw) or \
        (kind == "session.update" and "session" not in raw and "model" in raw)


class ReferenceVariant:
    def __init__(self, gateway: EngineGateway, model: str, conversation: Conversation, send: Send):
        self.gateway = gateway
        self.model = model
        self.conversation = conversation
        self.send = send
        self.task: asyncio.Task | None = None
        self._buffer: list[np.ndarray] = []

    def buffered(self) -> int:
        return sum(len(a) for a in self._buffer)

    async def handle(self, raw: dict[str, Any]) -> None:
        kind = raw.get("type")
        if kind == "session.update":
            if raw.get("model") not in (None, self.model):
                raise bad_request(f"model: this server serves {self.model!r}", param="model")
            return
        if kind == "input_audio_buffer.append":
            audio = audio_format.decode_base64(str(raw.get("audio", "")), "audio/pcm", "audio")
            self._buffer.append(audio)  # the session checks the limit (self.buffered()) after this
            return
        if kind == "input_audio_buffer.commit":
            if raw.get("final") is True:
                await self._answer()
            elif raw.get("final") not in (False, None):
                raise bad_request("final: true or false", param="final")
            return
        raise bad_request(f"type: {kind!r} is not an event of this protocol variant", param="type")

    async def _answer(self) -> None:
        if self.task is not None and not self.task.done():
            raise bad_request("a turn is still being answered", code="conversation_already_has_active_response")
        if not self._buffer:
            raise bad_request("no audio was appended since the last turn", code="input_audio_buffer_commit_empty")
        audio, self._buffer = np.concatenate(self._buffer), []
        self.conversation.insert(Item("user", [Part("input_audio", audio=audio, sample_rate=INPUT_RATE)]))
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        answer = Item("assistant", [Part("output_audio")])
        prompt = {"messages": self.conversation.messages("")}
        entry = self.gateway.engine.spec.entry_stages[0].name
        params = {entry: entry_sampling_params({}, {}, fallback={"max_tokens": None})}
        final, has_audio = None, False
        try:
            async for out in self.gateway.submit(prompt, params, new_id("rt"), ("text", "audio")):
                if out.text_delta:
                    answer.parts[0].text += out.text_delta
                    await self.send({"type": "transcription.delta", "delta": out.text_delta})
                if out.audio_chunk is not None and len(out.audio_chunk):
                    has_audio = True
                    pcm = audio_format.encode(out.audio_chunk, out.sample_rate, "audio/pcm")
                    await self.send({"type": "response.audio.delta", "audio": base64.b64encode(pcm).decode(),
                                     "format": "pcm16", "sample_rate_hz": OUTPUT_RATE})
                if out.finished:
                    final = out
            prompt_count, completion = prompt_tokens(final), completion_tokens(final)
            await self.send({"type": "transcription.done", "text": answer.parts[0].text, "usage": {
                "prompt_tokens": prompt_count, "completion_tokens": completion,
                "total_tokens": prompt_count + completion}})
        except APIError as e:
            await self.send(error_event(e))
        finally:
            self.conversation.insert(answer)
        await self.send({"type": "response.audio.done", "has_audio": has_audio})


def error_event(error: APIError) -> dict[str, Any]:
    return {"type": "error", "error": error.message, "code": error.code}
