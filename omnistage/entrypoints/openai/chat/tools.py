"""Tool calling: what the chat template gets, the grammar a forced call follows, and the
per-family parsers that find tool calls in a model's text.

`tool_choice`:
- "none": the template gets no tools and nothing is parsed;
- "auto" (the default when `tools` is given): the template gets the tools; the family's
  parser finds the calls in the text;
- "required" / a named function: a grammar (structured outputs) makes the model write a
  JSON list of calls / the named function's arguments, so the call always parses.

Parsers are chosen by the checkpoint's `model_type`. Qwen's families (and models trained
on the same "Hermes" format) write `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's `function.arguments`
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


class HermesToolParser:
    """`<tool_call>{json}</tool_call>` blocks (Qwen2/2.5/3, Qwen2.5-Omni's thinker, Hermes)."""

    start = "<tool_call>"
    _block = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content outside the calls or None, the calls). A block that is not a JSON call
        with a string `name` is left in the content."""
        calls: list[ToolCall] = []
        kept: list[str] = []
        pos = 0
        for match in self._block.finditer(text):
            call = _as_call(match.group(1))
            if call is None:
                continue
            kept.append(text[pos:match.start()])
            pos = match.end()
            calls.append(call)
        kept.append(text[pos:])
        content = "".join(kept).strip()
        return (content or None) if calls else (text or None), calls


def _as_call(raw: str) -> ToolCall | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ToolCall(value["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


_PARSERS_BY_MODEL_TYPE = {"qwen2": HermesToolParser, "qwen2_5_omni": HermesToolParser, "qwen3": HermesToolParser,
                          "qwen2_moe": HermesToolParser, "qwen3_moe": HermesToolParser}


def parser_for(model_type: str | None) -> HermesToolParser:
    """The family's parser; families without one of their own get Hermes' format, the
    most common one among open chat models."""
    return _PARSERS_BY_MODEL_TYPE.get(model_type or "", HermesToolParser)()


# --- forced calls ------------------------------------------------------------------------

def arguments_schema(tool: dict[str, Any]) -> dict[str, Any]:
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def required_calls_schema(tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """A JSON list of calls, each {"name": one of the tools, "arguments": its parameters}."""
    one_of = [{"type": "object",
               "properties": {"name": {"const": t["function"]["name"]}, "arguments": arguments_schema(t)},
               "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": one_of}, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def calls_from_required(text: str) -> list[ToolCall]:
    values = json.loads(text)
    return [ToolCall(v["name"], json.dumps(v["arguments"])) for v in values]


# --- messages for the template -------------------------------------------------------------

def template_tool_calls(tool_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant message's calls as chat templates read them: arguments as a dict."""
    out = []
    for call in tool_calls:
        function = dict(call["function"])
        try:
            function["arguments"] = json.loads(function["arguments"])
        except (ValueError, TypeError):
            pass
        out.append({"id": call.get("id"), "type": "function", "function": function})
    return out
