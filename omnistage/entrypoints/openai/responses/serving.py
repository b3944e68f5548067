"""The Responses API over the chat path: a body becomes a chat body, checked and built by
`ChatServing.prepare`, run as one engine request, and answered as a response object.

1. Check what only Responses has (`background`, `include`, chat field names sent here).
2. The conversation: with `previous_response_id`, the stored turns before this input.
3. The chat body; the chat route's checks run on it and their errors name our fields.
4. Run: in the background (answer `queued`, poll with GET), streamed (SSE events, see
   stream.py) or whole; then store the response with its input (`store`, the default).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from omnistage.entrypoints.openai.chat.protocol import ChatCompletionRequest
from omnistage.entrypoints.openai.chat.serving import ChatJob, ChatServing
from omnistage.entrypoints.openai.common import validate
from omnistage.entrypoints.openai.engine_client import cancel_on_disconnect
from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.entrypoints.openai.responses.conversation import chat_messages, history_items
from omnistage.entrypoints.openai.responses.output import new_id, output_items, response_object, response_usage
from omnistage.entrypoints.openai.responses.protocol import InputItem, ResponsesRequest
from omnistage.entrypoints.openai.responses.store import INTERRUPTED, UNFINISHED, ResponseStore
from omnistage.entrypoints.openai.responses.stream import stream_events
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.text_generation import collect_all, open_streams

_ITEMS = TypeAdapter(list[InputItem])
# Chat fields the Responses API names otherwise or lacks: sent here, they are unknown fields
# (not sampling extras), so `max_tokens` cannot quietly stand in for `max_output_tokens`.
_CHAT_ONLY = set(ChatCompletionRequest.model_fields) - set(ResponsesRequest.model_fields)
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


class ResponsesServing:
    def __init__(self, chat: ChatServing, settings: ServerSettings):
        self.chat = chat
        self.settings = settings
        self._store: ResponseStore | None = None
        self._background: dict[str, asyncio.Task] = {}

    @property
    def store(self) -> ResponseStore:
        """Opened on first use: on disk under `files_dir` (the `--output-dir`), else in memory."""
        if self._store is None:
            directory = Path(self.settings.files_dir) / "responses" if self.settings.files_dir is not None else None
            self._store = ResponseStore(directory, self.settings.response_ttl_s, self.settings.max_stored_responses)
        return self._store

    async def create(self, body: ResponsesRequest, request: Any) -> dict[str, Any] | AsyncIterator[str]:
        # 1. What only Responses checks
        self.chat.capabilities.require("chat")
        unknown = sorted(set(body.extras()) & _CHAT_ONLY)
        if unknown:
            raise bad_request(f"unknown field {unknown[0]!r} (a chat completions field)", param=unknown[0],
                              code="unknown_field")
        if body.include:
            raise bad_request("include: no extra output data is available here", param="include")
        if body.background and not body.store:
            raise bad_request("background: a background response needs store: true", param="background")
        if body.background and body.stream:
            raise bad_request("background: stream a background response by polling GET /v1/responses/{id}",
                              param="background")
        # 2. The conversation so far
        context: list[dict[str, Any]] = []
        if body.previous_response_id is not None:
            previous = self._record(body.previous_response_id, "previous_response_id")
            if previous["response"]["status"] in UNFINISHED:
                raise bad_request("previous_response_id: that response has not finished", param="previous_response_id")
            context = previous["context"] + previous["input_items"] + history_items(previous["response"]["output"])
        input_items = _input_items(body)
        # 3. The chat body, checked and built by the chat route
        items = _ITEMS.validate_python(context + input_items)
        where = ["previous_response_id"] * len(context) + (
            ["input"] if isinstance(body.input, str) else [f"input[{i}]" for i in range(len(input_items))])
        messages, names = chat_messages(items, where, body.instructions)
        try:
            chat_body = validate(ChatCompletionRequest, _chat_fields(body, messages))
            job = await self.chat.prepare(chat_body, request.app.state.media)
        except APIError as e:
            raise names.translate(e) from None
        # 4. Run it
        response_id, created_at = new_id("resp"), time.time()
        entry = self.chat.gateway.engine.spec.entry_stages[0].name
        audio_format = body.audio.format if body.audio else "wav"

        def respond(status: str, output: list | None = None, usage_from: Any = None, error: dict | None = None
                    ) -> dict[str, Any]:
            usage = response_usage(usage_from, entry) if usage_from is not None else None
            return response_object(response_id, created_at, body, self.settings.served_model_name, status,
                                   output, usage, error)

        def finish(response: dict[str, Any]) -> None:
            if body.store:
                self.store.save(response, input_items, context)

        if body.background:
            queued = respond("queued")
            finish(queued)
            self._background[response_id] = asyncio.ensure_future(
                self._run_background(job, response_id, respond, audio_format))
            return queued
        if body.stream:
            streams = await open_streams(self.chat.gateway, job.jobs, response_id, job.wanted, job.session_id)
            return stream_events(streams, job, self.chat, respond, finish)

        async def go() -> dict[str, Any]:
            out = await self._run(job, response_id)
            output, status = await _output(out, job, self.chat, audio_format)
            response = respond(status, output, out)
            finish(response)
            return response

        return await cancel_on_disconnect(request, go())

    async def _run(self, job: ChatJob, response_id: str) -> Any:
        streams = await open_streams(self.chat.gateway, job.jobs, response_id, job.wanted, job.session_id)
        [out] = await collect_all(streams)
        return out

    async def _run_background(self, job: ChatJob, response_id: str, respond: Any, audio_format: str) -> None:
        try:
            self.store.update(respond("in_progress"))
            out = await self._run(job, response_id)
            output, status = await _output(out, job, self.chat, audio_format)
            self.store.update(respond(status, output, out))
        except asyncio.CancelledError:
            self.store.update(respond("cancelled"))
        except APIError as e:
            self.store.update(respond("failed", error={"code": e.code or e.type, "message": e.message}))
        finally:
            self._background.pop(response_id, None)

    # --- stored responses --------------------------------------------------------------------

    def _record(self, response_id: str, param: str = "response_id") -> dict[str, Any]:
        record = self.store.get(response_id)
        if record is None:
            raise APIError(404, f"no stored response {response_id!r} (never stored, deleted or expired)",
                           param=param, code="response_not_found")
        return record

    def get(self, response_id: str) -> dict[str, Any]:
        return self._record(response_id)["response"]

    async def delete(self, response_id: str) -> dict[str, Any]:
        self._record(response_id)
        await self._stop(response_id)
        self.store.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def cancel(self, response_id: str) -> dict[str, Any]:
        response = self._record(response_id)["response"]
        if not response["background"]:
            raise bad_request("only a background response can be cancelled", param="response_id")
        if response["status"] in UNFINISHED:
            await self._stop(response_id)
            return self._record(response_id)["response"]
        if response["status"] != "cancelled":
            raise bad_request(f"the response is {response['status']} already; it cannot be cancelled",
                              param="response_id")
        return response

    async def _stop(self, response_id: str, error: dict[str, Any] | None = None) -> None:
        """Stop a background response: `cancelled`, or `failed` with `error`."""
        task = self._background.get(response_id)
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # A task cancelled before its first step never ran its own handler.
        record = self.store.get(response_id)
        if record is not None and (record["response"]["status"] in UNFINISHED or error is not None):
            record["response"].update(status="failed" if error else "cancelled", error=error)
            self.store.update(record["response"])

    def input_items(self, response_id: str, limit: int, order: str, after: str | None) -> dict[str, Any]:
        items = list(self._record(response_id)["input_items"])
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise bad_request(f"after: {after!r} is not an input item of this response", param="after")
            items = items[ids.index(after) + 1:]
        page = items[:limit]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}

    async def shutdown(self) -> None:
        for response_id in list(self._background):
            await self._stop(response_id, INTERRUPTED)
        if self._store is not None:
            self._store.close()


async def _output(out: Any, job: ChatJob, chat: ChatServing, audio_format: str) -> tuple[list[dict[str, Any]], str]:
    """`output_items`; images and audio are encoded in a thread, off the event loop."""
    if out.images or (job.wants_audio and out.audio is not None):
        return await asyncio.to_thread(output_items, out, job, chat, audio_format)
    return output_items(out, job, chat, audio_format)


def _input_items(body: ResponsesRequest) -> list[dict[str, Any]]:
    """This request's input as stored items: each with an id, messages with a list of parts."""
    if isinstance(body.input, str):
        return [{"type": "message", "id": new_id("msg"), "role": "user", "status": "completed",
                 "content": [{"type": "input_text", "text": body.input}]}]
    items = []
    for item in body.input:
        value = item.model_dump(by_alias=True, exclude_none=True)
        value.setdefault("id", new_id(_ID_PREFIX[item.type]))
        if item.type == "message":
            value.setdefault("status", "completed")
            if isinstance(item.content, str):
                kind = "output_text" if item.role == "assistant" else "input_text"
                value["content"] = [{"type": kind, "text": item.content}]
        items.append(value)
    return items


def _chat_fields(body: ResponsesRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat body of a Responses body (extension and sampling extras pass as they are)."""
    fields: dict[str, Any] = {
        "model": body.model, "messages": messages, "stream": body.stream, "modalities": body.modalities,
        "audio": body.audio.model_dump() if body.audio else None, "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "user": body.user, "size": body.size,
        "parallel_tool_calls": body.parallel_tool_calls, **body.diffusion_fields(), **body.extras(),
    }
    fmt = body.text.format if body.text else None
    if fmt is not None:
        fields["response_format"] = {"type": fmt.type}
        if fmt.type == "json_schema":
            fields["response_format"]["json_schema"] = {"name": fmt.name, "schema": fmt.schema_,
                                                        "description": fmt.description, "strict": fmt.strict}
    if body.tools:
        fields["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                           for t in body.tools]
    choice = body.tool_choice
    if choice is not None:
        fields["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                        "function": {"name": choice.name}}
    return {k: v for k, v in fields.items() if v is not None}
