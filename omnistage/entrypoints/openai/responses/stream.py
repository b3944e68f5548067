"""A streamed response: OpenAI's Responses SSE events, from the engine's outputs.

    response.created, response.in_progress
    response.output_item.added (message), response.content_part.added (output_text)
    response.output_text.delta ...                     as the text comes
    response.audio.delta ... (omni, audio asked: base64 pcm16 at 24 kHz)
    response.output_text.done, response.content_part.done, response.output_item.done
    per call: response.output_item.added (function_call),
              response.function_call_arguments.delta / .done, response.output_item.done
    per image: response.output_item.added / .done (image_generation_call)
    response.completed | response.incomplete (max_output_tokens) | error + response.failed

Text that may hold a tool call is held back as on the chat route (`ContentGate`); calls
go out once parsed, at the end. The last event carries the whole response, which is also
what the store keeps.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from omnistage.entrypoints.openai.chat.serving import PCM16_RATE, ChatJob, ChatServing, ContentGate
from omnistage.entrypoints.openai.engine_client import RequestStream
from omnistage.entrypoints.openai.errors import APIError
from omnistage.entrypoints.openai.responses.output import message_item, new_id, output_items, text_part
from omnistage.entrypoints.openai.text_generation import merge_streams
from omnistage.media.audio import resample, to_pcm16


class EventWriter:
    """SSE lines of Responses events, numbered in order."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def __call__(self, type_: str, **fields: Any) -> str:
        payload = {"type": type_, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {type_}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def stream_events(streams: list[RequestStream], job: ChatJob, chat: ChatServing,
                        respond: Callable[..., dict[str, Any]], on_done: Callable[[dict[str, Any]], None]
                        ) -> AsyncIterator[str]:
    """`respond(status, output=..., usage_from=..., error=...)` makes the response object;
    `on_done(response)` gets the final one (to store it)."""
    event = EventWriter()
    response = respond("in_progress")
    yield event("response.created", response=response)
    yield event("response.in_progress", response=response)
    gate = ContentGate(chat.tool_parser.start if job.tool_mode == "auto" else None, job.tool_mode is not None)
    message_id = new_id("msg")
    is_open = False
    final = None
    try:
        async for _, out in merge_streams(streams):
            piece = gate.feed(out.text_delta) if out.text_delta else ""
            if piece:
                if not is_open:
                    is_open = True
                    for line in _open_message(event, message_id):
                        yield line
                yield _text_delta(event, message_id, piece)
            if job.wants_audio and out.audio_chunk is not None and len(out.audio_chunk):
                pcm = to_pcm16(resample(out.audio_chunk, out.sample_rate, PCM16_RATE))
                yield event("response.audio.delta", delta=base64.b64encode(pcm).decode())
            if out.finished:
                final = out
        build = functools.partial(output_items, final, job, chat, None, message_id=message_id, audio=False)
        items, status = await asyncio.to_thread(build) if final.images else build()  # PNGs: off the loop
        if is_open and items[0]["type"] != "message":  # text went out before the calls: it stays an item
            items.insert(0, message_item(message_id, [text_part(gate.sent)], status))
        if job.wants_audio:
            yield event("response.audio.done")
        for index, item in enumerate(items):
            if item["type"] == "message":
                if not is_open:
                    for line in _open_message(event, message_id, index):
                        yield line
                text = item["content"][0]["text"] if item["content"][0]["type"] == "output_text" else ""
                rest = gate.rest(text) if is_open else text
                if rest:
                    yield _text_delta(event, message_id, rest, index)
                yield event("response.output_text.done", item_id=message_id, output_index=index, content_index=0,
                            text=text, logprobs=[])
                yield event("response.content_part.done", item_id=message_id, output_index=index, content_index=0,
                            part=text_part(text))
            elif item["type"] == "function_call":
                yield event("response.output_item.added", output_index=index,
                            item={**item, "arguments": "", "status": "in_progress"})
                yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                            delta=item["arguments"])
                yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            name=item["name"], arguments=item["arguments"])
            else:
                yield event("response.output_item.added", output_index=index,
                            item={**item, "result": None, "status": "in_progress"})
            yield event("response.output_item.done", output_index=index, item=item)
        response = respond(status, output=items, usage_from=final)
        on_done(response)
        yield event("response.completed" if status == "completed" else "response.incomplete", response=response)
    except APIError as e:
        error = {"code": e.code or e.type, "message": e.message}
        yield event("error", code=e.code or e.type, message=e.message, param=e.param)
        response = respond("failed", error=error)
        on_done(response)
        yield event("response.failed", response=response)


def _open_message(event: EventWriter, message_id: str, index: int = 0) -> list[str]:
    return [event("response.output_item.added", output_index=index,
                  item=message_item(message_id, [], "in_progress")),
            event("response.content_part.added", item_id=message_id, output_index=index, content_index=0,
                  part=text_part(""))]


def _text_delta(event: EventWriter, message_id: str, delta: str, index: int = 0) -> str:
    return event("response.output_text.delta", item_id=message_id, output_index=index, content_index=0,
                 delta=delta, logprobs=[])
