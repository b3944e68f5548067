"""Chat request and response bodies (OpenAI's), with vLLM's sampling extensions.

Content parts: `text`, `image_url` (a data URL or bare base64, or a URL the server
fetches when its host is allowed: see media_fetch.py), `input_audio` ({data: base64 or
such a URL, format}), `audio_url` (a data URL or such a URL) and `video_url` (an encoded
video as such a URL; omni models, with `mm_processor_kwargs.use_audio_in_video`). Sampling
fields beyond OpenAI's (`top_k`, `min_p`, `repetition_penalty`, `min_tokens`,
`stop_token_ids`, `ignore_eos`, `structured_outputs`, `guided_*`) go at the top level,
as with vLLM. Text models also take `n`, `logprobs`/`top_logprobs`, `response_format`
and `tools`/`tool_choice`/`parallel_tool_calls`, with `tool` messages and assistant
`tool_calls` in the history. For image models the diffusion fields of the images routes
(`size`, `num_inference_steps`, ...) apply. The batch route takes a list of conversations
(`ChatCompletionBatchRequest`) and answers each in its own choice (`BatchChoice`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from omnistage.entrypoints.openai.common import DiffusionFields


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageURL(_Strict):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageURL


class InputAudio(_Strict):
    data: str
    format: Literal["wav", "mp3", "flac", "ogg"] = "wav"


class InputAudioPart(_Strict):
    type: Literal["input_audio"]
    input_audio: InputAudio


class AudioURL(_Strict):
    url: str


class AudioURLPart(_Strict):
    type: Literal["audio_url"]
    audio_url: AudioURL


class VideoURL(_Strict):
    url: str


class VideoURLPart(_Strict):
    type: Literal["video_url"]
    video_url: VideoURL


ContentPart = Annotated[TextPart | ImagePart | InputAudioPart | AudioURLPart | VideoURLPart, Field(discriminator="type")]


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCallItem(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = None
    """An assistant message's calls (sent back with the tools' answers)."""
    tool_call_id: str | None = None
    """A tool message: the call it answers."""


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JSONSchemaFormat(_Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class AudioOptions(_Strict):
    voice: str | None = None
    format: Literal["wav", "mp3", "flac", "opus", "pcm16"] = "wav"


class MMProcessorKwargs(_Strict):
    use_audio_in_video: bool = False
    """Omni models: hear each video's own audio track with its frames (vLLM's field)."""


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatCompletionRequest(DiffusionFields):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    modalities: list[Literal["text", "audio", "image"]] | None = None
    audio: AudioOptions | None = None
    mm_processor_kwargs: MMProcessorKwargs | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    frequency_penalty: Literal[0, 0.0] | None = None
    """Accepted only as 0: the engine has no frequency penalty (use repetition_penalty)."""
    presence_penalty: Literal[0, 0.0] | None = None
    """Accepted only as 0: the engine has no presence penalty (use repetition_penalty)."""
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    """With `logprobs`: the most likely alternatives per token."""
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    size: str | None = None
    """Image models: 'WIDTHxHEIGHT' of the answer image."""


MAX_BATCH_CONVERSATIONS = 256
"""Most conversations one POST /v1/chat/completions/batch may carry."""


class ChatCompletionBatchRequest(ChatCompletionRequest):
    """POST /v1/chat/completions/batch: `messages` is a list of conversations, answered in one
    response with one choice per conversation, in order; every other field applies to each.
    No streaming, tools or n > 1."""

    messages: list[Annotated[list[ChatMessage], Field(min_length=1)]] = Field(  # type: ignore[assignment]
        min_length=1, max_length=MAX_BATCH_CONVERSATIONS)


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class AudioAnswer(BaseModel):
    id: str
    data: str
    expires_at: int
    transcript: str


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | list[dict[str, Any]] | None = None
    audio: AudioAnswer | None = None
    refusal: None = None
    tool_calls: list[dict[str, Any]] | None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None = "stop"
    logprobs: dict[str, Any] | None = None


class BatchChoice(BaseModel):
    """One conversation's answer in a batch: its own status, and its error when it failed."""

    index: int
    status: int = 200
    """200, or the status this conversation would have got alone (400 for its bad input, 503, 500)."""
    message: AssistantMessage | None = None
    finish_reason: str | None = "stop"
    logprobs: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    """OpenAI's error object (message, type, param, code) when `status` is not 200; `param` is
    located in the batch body (`messages[2][0].content`)."""


class ChatCompletionBatch(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[BatchChoice]
    usage: Usage
    """Summed over the conversations that were answered."""


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
