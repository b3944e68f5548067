"""The response object and its output items, from a request's finished engine output.

- text: one `message` item with an `output_text` part; calls the model made (parsed as on
  the chat route) are `function_call` items after it (no message when only calls came);
- omni with audio asked: the message also has an `output_audio` part (`data` base64 in
  `audio.format`, `transcript`);
- image models: one `image_generation_call` item per image (`result`: base64 PNG).

A length cut makes the response `incomplete` with `incomplete_details.reason`
"max_output_tokens", as OpenAI.
"""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

from omnistage.entrypoints.openai.chat.serving import ChatJob, ChatServing, encode_answer_audio
from omnistage.entrypoints.openai.responses.protocol import ResponsesRequest
from omnistage.entrypoints.openai.text_generation import cached_tokens, finish_reason, usage
from omnistage.media.image import encode_image


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_object(response_id: str, created_at: float, body: ResponsesRequest, model: str, status: str,
                    output: list[dict[str, Any]] | None = None, usage: dict[str, Any] | None = None,
                    error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The public response object; the request's settings are echoed as OpenAI does."""
    output = output or []
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    fmt = body.text.format.model_dump(by_alias=True) if body.text and body.text.format else {"type": "text"}
    tool_choice = body.tool_choice or "auto"
    return {
        "id": response_id, "object": "response", "created_at": created_at, "status": status,
        "completed_at": time.time() if status in ("completed", "incomplete") else None,
        "error": error, "incomplete_details": incomplete, "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens, "max_tool_calls": body.max_tool_calls, "model": model,
        "output": output, "output_text": output_text(output),
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id, "prompt_cache_key": body.prompt_cache_key,
        "reasoning": {"effort": None, "summary": None}, "safety_identifier": body.safety_identifier,
        "service_tier": "default", "store": body.store, "background": body.background,
        "temperature": body.temperature, "top_p": body.top_p,
        "text": {"format": fmt, "verbosity": body.text.verbosity if body.text else None},
        "tool_choice": tool_choice if isinstance(tool_choice, str) else tool_choice.model_dump(),
        "tools": [t.model_dump() for t in body.tools or []], "truncation": "disabled", "usage": usage,
        "user": body.user, "metadata": body.metadata or {},
    }


def output_text(output: list[dict[str, Any]]) -> str:
    """The SDK's `output_text`: every output_text part, joined (also sent, for plain HTTP clients)."""
    return "".join(p["text"] for item in output if item["type"] == "message"
                   for p in item["content"] if p["type"] == "output_text")


def response_usage(out: Any, entry_stage: str) -> dict[str, Any]:
    counts = usage([out])
    cached = cached_tokens(out, entry_stage)
    return {"input_tokens": counts["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": counts["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"]}


def output_items(out: Any, job: ChatJob, chat: ChatServing, audio_format: str | None,
                 message_id: str | None = None, audio: bool = True) -> tuple[list[dict[str, Any]], str]:
    """(output items, status) of a finished output. `message_id` keeps the id a stream
    announced; `audio=False` leaves the audio data out (a stream sent it as deltas)."""
    if out.images:
        return [{"type": "image_generation_call", "id": new_id("ig"), "status": "completed",
                 "result": base64.b64encode(encode_image(image, "png")).decode()} for image in out.images], "completed"
    content, calls, reason = chat.tool_answer(out.text, finish_reason(out), job.tool_mode)
    status = "incomplete" if reason == "length" else "completed"
    parts: list[dict[str, Any]] = []
    if content or not calls:
        parts.append(text_part(content or ""))
    if job.wants_audio and out.audio is not None:
        data = base64.b64encode(encode_answer_audio(out.audio, out.sample_rate, audio_format)).decode() if audio else None
        parts.append({"type": "output_audio", "data": data, "transcript": out.text or ""})
    items = []
    if parts:
        items.append(message_item(message_id or new_id("msg"), parts, status))
    for call in calls or []:
        items.append(function_call_item(call["id"], call["function"]["name"], call["function"]["arguments"]))
    return items, status


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": parts}


def function_call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": new_id("fc"), "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}
