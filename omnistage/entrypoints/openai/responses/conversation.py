"""A Responses conversation as the chat route's messages, and the chat route's field
names back as the Responses' ones.

The route serves Responses through the chat path (one way to build and run a request), so
its items become chat messages:
- `instructions` -> a system message first;
- a message item -> a message (`input_text` -> `text`, `input_image` -> `image_url`,
  `input_audio` -> `input_audio`, `input_file` -> `audio_url`, `output_text` -> `text`);
- `function_call` items -> `tool_calls` of an assistant message (joined to the assistant
  message just before, as chat templates expect one assistant turn);
- `function_call_output` -> a `tool` message.

A chat error names a chat field (`messages[3].content[0].image_url`); `FieldNames` turns
it into the item it came from (`input[2].content[0].image_url`).
"""

from __future__ import annotations

import re
from typing import Any

from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.entrypoints.openai.responses.protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputFile,
    InputImage,
    MessageItem,
)

_CHAT_FIELDS = {
    "response_format.json_schema.schema": "text.format.schema",
    "response_format.json_schema": "text.format.schema",
    "response_format": "text.format",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "tool_choice.function.name": "tool_choice.name",
    "messages": "input",
}
_MESSAGE_FIELD = re.compile(r"messages\[(\d+)\](?:\.content\[(\d+)\](?:\.\w+)?)?")


class FieldNames:
    """Where each chat message (and each of its parts) came from in the Responses body."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.parts: list[list[str]] = []

    def add(self, where: str, parts: list[str] | None = None) -> None:
        self.messages.append(where)
        self.parts.append(parts or [])

    def rename(self, param: str | None) -> str | None:
        if param is None:
            return None
        match = _MESSAGE_FIELD.fullmatch(param)
        if match:
            index, part = int(match.group(1)), match.group(2)
            if part is not None and int(part) < len(self.parts[index]):
                return self.parts[index][int(part)]
            return self.messages[index]
        return _CHAT_FIELDS.get(param, param)

    def translate(self, error: APIError) -> APIError:
        """The chat route's error, naming the Responses field."""
        renamed = self.rename(error.param)
        if renamed == error.param:
            return error
        message = error.message.replace(error.param, renamed, 1) if error.param else error.message
        return APIError(error.status, message, param=renamed, code=error.code, type=error.type, headers=error.headers)


def chat_messages(items: list[Any], where: list[str], instructions: str | None) -> tuple[list[dict[str, Any]],
                                                                                        FieldNames]:
    """Chat messages (as dicts for `ChatCompletionRequest`) of `items`; `where[i]` names item i."""
    names = FieldNames()
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
        names.add("instructions")
    for item, at in zip(items, where):
        if isinstance(item, MessageItem):
            content, parts = _content(item, at)
            messages.append({"role": item.role, "content": content})
            names.add(at, parts)
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                names.add(at)
        elif isinstance(item, FunctionCallOutputItem):
            output = item.output if isinstance(item.output, str) else "\n".join(p.text for p in item.output)
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
            names.add(at)
    if not messages:
        raise bad_request("input: give at least one item", param="input")
    return messages, names


def _content(item: MessageItem, at: str) -> tuple[str | list[dict[str, Any]], list[str]]:
    if isinstance(item.content, str):
        return item.content, []
    parts: list[dict[str, Any]] = []
    names: list[str] = []
    for j, part in enumerate(item.content):
        field = f"{at}.content[{j}]"
        if part.type in ("input_text", "output_text"):
            parts.append({"type": "text", "text": part.text})
        elif part.type == "refusal":
            parts.append({"type": "text", "text": part.refusal})
        elif part.type == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(part, field)}})
            field += ".image_url"
        elif part.type == "input_audio":
            parts.append({"type": "input_audio", "input_audio": part.input_audio.model_dump()})
            field += ".input_audio"
        else:
            url, name = _file_url(part, field)
            parts.append({"type": "audio_url", "audio_url": {"url": url}})
            field = name
        names.append(field)
    return parts, names


def _image_url(part: InputImage, field: str) -> str:
    if part.file_id is not None:
        raise bad_request(f"{field}.file_id: this server has no files API; send image_url", param=f"{field}.file_id")
    if part.image_url is None:
        raise bad_request(f"{field}.image_url: an input_image needs image_url", param=f"{field}.image_url")
    return part.image_url


def _file_url(part: InputFile, field: str) -> tuple[str, str]:
    if part.file_id is not None:
        raise bad_request(f"{field}.file_id: this server has no files API; send file_data or file_url",
                          param=f"{field}.file_id")
    given = [k for k in ("file_data", "file_url") if getattr(part, k) is not None]
    if len(given) != 1:
        raise bad_request(f"{field}: an input_file needs one of file_data and file_url", param=field)
    return getattr(part, given[0]), f"{field}.{given[0]}"


def history_items(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as input items of the next turn: messages keep their
    text (an audio answer its transcript), calls stay calls; generated images are not
    read back (no model here takes its own image answers as history)."""
    items: list[dict[str, Any]] = []
    for item in output:
        if item["type"] == "function_call":
            items.append({k: item[k] for k in ("type", "id", "call_id", "name", "arguments")})
        elif item["type"] == "message":
            texts = [p.get("text", p.get("transcript", "")) for p in item["content"]]
            items.append({"type": "message", "id": item["id"], "role": "assistant",
                          "content": [{"type": "output_text", "text": "".join(texts)}]})
    return items
