"""Responses request bodies (OpenAI's), and the extension fields omnistage adds.

`input` is a string (one user message) or a list of items:
- messages (`type` "message", or no `type`): `role` user / system / developer / assistant,
  `content` a string or parts: `input_text`, `input_image` (`image_url`: a data URL, or a
  URL the server may fetch), `input_audio` ({data, format}), `input_file` (`file_data` or
  `file_url`: audio, for models that hear), and on assistant messages `output_text`;
- `function_call` (a call the model made, sent back) and `function_call_output` (its result).

Extensions, as on the chat route: `seed`, `modalities` / `audio` (omni models answer with
audio), `size` and the diffusion fields for image models, and vLLM's sampling fields
(`top_k`, `min_p`, `repetition_penalty`, ...) at the top level.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from omnistage.entrypoints.openai.chat.protocol import AudioOptions
from omnistage.entrypoints.openai.common import DiffusionFields


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputText(_Strict):
    type: Literal["input_text"]
    text: str


class OutputText(_Strict):
    """An earlier answer's text, sent back as history."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class InputImage(_Strict):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high", "original"] | None = None


class InputAudioData(_Strict):
    data: str
    format: Literal["wav", "mp3", "flac", "ogg"] = "wav"


class InputAudio(_Strict):
    type: Literal["input_audio"]
    input_audio: InputAudioData


class InputFile(_Strict):
    type: Literal["input_file"]
    file_data: str | None = None
    file_url: str | None = None
    file_id: str | None = None
    filename: str | None = None


class Refusal(_Strict):
    type: Literal["refusal"]
    refusal: str


def _by_type(*models: type[BaseModel], default: str | None = None) -> Any:
    """A union picked by `type` (absent: `default`). Each branch's tag ends in "[]", a name
    the error path leaves out, so an error names `input[0].content[1].image_url`, not the
    branch it tried."""

    def pick(value: Any) -> str | None:
        kind = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", default)
        return f"{kind}[]" if isinstance(kind, str) else None

    names = [m.model_fields["type"].annotation.__args__[0] for m in models]
    branches = tuple(Annotated[m, Tag(f"{name}[]")] for m, name in zip(models, names))
    return Annotated[Union[branches], Discriminator(
        pick, custom_error_type="invalid_type",
        custom_error_message=f"type must be one of {', '.join(names)}")]


def _text_or(items: Any) -> Any:
    """A string or a list (a str | list union would report both branches' errors)."""
    return Annotated[Union[Annotated[str, Tag("text[]")], Annotated[items, Tag("items[]")]],
                     Discriminator(lambda v: "text[]" if isinstance(v, str) else "items[]")]


ContentPart = _by_type(InputText, OutputText, InputImage, InputAudio, InputFile, Refusal)


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: _text_or(list[ContentPart])
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: _text_or(list[InputText])
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


InputItem = _by_type(MessageItem, FunctionCallItem, FunctionCallOutputItem, default="message")  # "easy" messages


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Strict):
    type: Literal["function"]
    name: str


class TextFormatText(_Strict):
    type: Literal["text"]


class TextFormatJSONObject(_Strict):
    type: Literal["json_object"]


class TextFormatJSONSchema(_Strict):
    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[TextFormatText | TextFormatJSONObject | TextFormatJSONSchema, Field(discriminator="type")]


class TextOptions(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(_Strict):
    """Accepted and ignored: the served models do not take a reasoning budget."""

    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class StreamOptions(_Strict):
    include_obfuscation: bool | None = None
    """Accepted; no obfuscation padding is added (it guards against a side channel of
    hosted services, which a self-hosted server does not have)."""


class ResponsesRequest(DiffusionFields):
    model: str | None = None
    input: _text_or(list[InputItem])
    instructions: str | None = None
    """A system message put first; not carried over by `previous_response_id` (as OpenAI)."""
    previous_response_id: str | None = None
    store: bool = True
    background: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    text: TextOptions | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(default=None, ge=1)
    reasoning: Reasoning | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    """Accepted and echoed: the engine's prefix cache finds shared prefixes by their tokens."""
    truncation: Literal["disabled"] | None = None
    """Only "disabled": an input over the context length is a 400, never cut."""
    include: list[str] | None = None
    service_tier: Literal["auto", "default"] | None = None
    modalities: list[Literal["text", "audio", "image"]] | None = None
    audio: AudioOptions | None = None
    size: str | None = None
    """Image models: 'WIDTHxHEIGHT' of the answer image."""
