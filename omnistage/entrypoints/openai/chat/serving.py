"""Chat completions: decode the messages' media, run the request, answer in OpenAI's shape.

What the answer holds follows the model's final stages:
- text (LLM): `message.content`; streamed as `delta.content`;
- text and audio (omni), with `modalities` naming "audio": `message.audio` (`data`
  base64 in `audio.format`, `transcript`), as OpenAI does; streamed as `delta.audio`
  with 24 kHz PCM16 `data` chunks and `transcript` pieces. Without "audio" the engine
  is asked for text only, so an omni model runs its thinker alone;
- image (diffusion): `message.content` as a list with one `image_url` part per image;
  the prompt is the last user message's text, its images the input images.

Text models: `n` choices are n engine requests (text_generation.py); `response_format`
and forced tool calls become `structured_outputs` (a grammar in the sampler); tool calls
are parsed per family (tools.py) and streamed once complete, content before a call
streaming as usual (`ContentGate`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from dataclasses import dataclass
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

from omnistage.ar.sampling_params import SamplingParams
from omnistage.ar.structured_outputs import StructuredOutputsParams
from omnistage.core.errors import RequestError
from omnistage.diffusion.params import DiffusionParams
from omnistage.entrypoints.openai.capabilities import Capabilities, media_inputs
from omnistage.entrypoints.openai.chat.protocol import (
    AssistantMessage,
    AudioAnswer,
    BatchChoice,
    ChatCompletion,
    ChatCompletionBatch,
    ChatCompletionBatchRequest,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    Usage,
)
from omnistage.entrypoints.openai.chat import tools
from omnistage.entrypoints.openai.common import check_n, parse_size
from omnistage.entrypoints.openai.engine_client import (
    EngineGateway,
    RequestStream,
    cancel_on_disconnect,
    new_request_id,
)
from omnistage.entrypoints.openai.errors import APIError, bad_request, from_value_error
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.text_generation import (
    chat_logprobs,
    choice_params,
    collect_all,
    entry_sampling_params,
    finish_reason,
    merge_streams,
    open_streams,
    usage,
    with_model_adapter,
)
from omnistage.entrypoints.openai.media_inputs import InputMedia
from omnistage.media.audio import encode_audio, resample, to_pcm16
from omnistage.media.image import image_to_data_url

PCM16_RATE = 24000  # OpenAI's pcm16 is 24 kHz mono little-endian
_AUDIO_FORMATS = {"wav": "wav", "mp3": "mp3", "flac": "flac", "opus": "opus", "pcm16": "pcm"}
_SAMPLING_FIELDS = ("temperature", "top_p", "stop", "seed")
_PART_MEDIA = {"image_url": "image", "video_url": "image", "input_audio": "audio", "audio_url": "audio"}
"""The encoder each media part needs (a video's frames go through the vision encoder)."""
_UNREAD = object()


@dataclass
class ChatJob:
    """A checked chat body as engine requests: one (prompt, params) per choice."""

    jobs: list[tuple[Any, Any]]
    wanted: tuple[str, ...] | None
    """The modalities the answer needs (None: all the model makes)."""
    wants_audio: bool
    tool_mode: str | None
    """None, "auto", "required" or the forced function's name (see `_tool_mode`)."""
    session_id: str | None = None
    """The body's `user`: stages routed by affinity keep one user's conversation on one replica."""


class ChatServing:
    def __init__(self, gateway: EngineGateway, capabilities: Capabilities, settings: ServerSettings):
        self.gateway = gateway
        self.capabilities = capabilities
        self.settings = settings
        self._tool_parser: Any = None
        self._media_inputs: Any = _UNREAD

    @property
    def tool_parser(self) -> Any:
        if self._tool_parser is None:
            self._tool_parser = tools.parser_for(_model_type(self.settings.model_path))
        return self._tool_parser

    async def create(self, body: ChatCompletionRequest, request: Any) -> ChatCompletion | AsyncIterator[str]:
        """A `ChatCompletion`, or the SSE lines of a streamed one (`stream: true`)."""
        job = await self.prepare(body, request.app.state.media)
        request_id = new_request_id("chatcmpl")
        if body.stream:
            streams = await open_streams(self.gateway, job.jobs, request_id, job.wanted, job.session_id)
            return self._sse(streams, body, request_id, job.wants_audio, job.tool_mode)

        async def go() -> ChatCompletion:
            streams = await open_streams(self.gateway, job.jobs, request_id, job.wanted, job.session_id)
            return await self._complete(await collect_all(streams), body, request_id, job.wants_audio, job.tool_mode)

        return await cancel_on_disconnect(request, go())

    async def create_batch(self, body: ChatCompletionBatchRequest, request: Any) -> ChatCompletionBatch:
        """Every conversation of `body.messages` as its own request, run together; one choice each,
        in order, with its own status (a conversation's failure fails only its choice)."""
        self.capabilities.require("chat")
        for name, given in (("stream", body.stream), ("n", body.n > 1), ("tools", bool(body.tools)),
                            ("tool_choice", body.tool_choice not in (None, "none"))):
            if given:
                raise bad_request(f"{name}: the batch route answers plain completions (no streaming, tools "
                                  f"or n > 1)", param=name)
        body = await with_model_adapter(body, self.settings, self.gateway.engine)
        media, request_id = request.app.state.media, new_request_id("chatcmpl")

        async def one(index: int, conversation: list[ChatMessage]) -> tuple[BatchChoice, Usage | None]:
            item = body.model_copy(update={"messages": conversation})  # the rest of the body applies to each
            try:
                job = await self.prepare(item, media)
                streams = await open_streams(self.gateway, job.jobs, f"{request_id}-{index}", job.wanted,
                                             job.session_id)
                done = await self._complete(await collect_all(streams), item, request_id, job.wants_audio, None)
            except (APIError, ValueError) as e:
                error = e if isinstance(e, APIError) else from_value_error(e)
                body_error = error.body()["error"]
                if body_error["param"] and body_error["param"].startswith("messages"):
                    body_error["param"] = f"messages[{index}]{body_error['param'][len('messages'):]}"
                return BatchChoice(index=index, status=error.status, finish_reason="error", error=body_error), None
            choice = done.choices[0]
            return BatchChoice(index=index, message=choice.message, finish_reason=choice.finish_reason,
                               logprobs=choice.logprobs), done.usage

        async def run_all() -> list[tuple[BatchChoice, Usage | None]]:
            return await asyncio.gather(*(one(i, c) for i, c in enumerate(body.messages)))

        answers = await cancel_on_disconnect(request, run_all())
        total = Usage()
        for _, used in answers:
            if used is not None:
                total = Usage(**{k: getattr(total, k) + getattr(used, k) for k in Usage.model_fields})
        return ChatCompletionBatch(id=request_id, created=int(time.time()), model=self.settings.served_model_name,
                                   choices=[choice for choice, _ in answers], usage=total)

    async def prepare(self, body: ChatCompletionRequest, media: InputMedia) -> ChatJob:
        """Check the body and build its engine requests (the Responses route shares this)."""
        self.capabilities.require("chat")
        body = await with_model_adapter(body, self.settings, self.gateway.engine)
        check_n(body.n, self.settings)
        modalities = body.modalities or []
        wants_audio = "audio" in modalities
        if wants_audio:
            self.capabilities.require("chat.audio")
            if body.stream and body.audio is not None and body.audio.format != "pcm16":
                raise bad_request("audio.format: streamed audio is pcm16 only", param="audio.format")
            if body.n > 1:
                raise bad_request("n: audio answers come one per request", param="n")
        outputs = self.capabilities.outputs
        for modality in modalities:
            if modality not in outputs:
                raise bad_request(f"modalities: model {self.capabilities.model!r} outputs "
                                  f"{' and '.join(sorted(outputs))}, not {modality}", param="modalities")
        tool_mode = None
        # The builders decode (and may fetch) the messages' media: in the media pool, off the loop.
        if "image" in outputs:
            prompt, params = await media.run(self._diffusion_request, body, media)
            return ChatJob([(prompt, params)], None, False, None, body.user)
        prompt, params, tool_mode = await media.run(self._text_request, body, media)
        entry = self.gateway.engine.spec.entry_stages[0].name
        jobs = [(prompt, {entry: p}) for p in choice_params(params, body.n)]
        # The answer is text (or audio with its transcript): no stage makes more than that.
        wanted = ("text", "audio") if wants_audio else ("text",)
        return ChatJob(jobs, wanted, wants_audio, tool_mode, body.user)

    # --- building the engine request -------------------------------------------------------

    def _text_request(self, body: ChatCompletionRequest, media: InputMedia) -> tuple[Any, SamplingParams, str | None]:
        image_only = [k for k in ("size", *body.diffusion_fields()) if k not in ("seed", "lora")
                      and getattr(body, k) is not None]
        if image_only:
            raise bad_request(f"{image_only[0]}: only image models take it", param=image_only[0])
        if body.max_tokens is not None and body.max_completion_tokens is not None:
            raise bad_request("give max_tokens or max_completion_tokens, not both", param="max_tokens")
        if body.top_logprobs is not None and not body.logprobs:
            raise bad_request("top_logprobs: needs logprobs: true", param="top_logprobs")
        tool_mode = _tool_mode(body)
        extras = body.extras()  # vLLM's extra sampling fields (top_k, min_p, structured_outputs, ...)
        structured = self._structured_outputs(body, tool_mode)
        if structured is not None:
            _check_grammar(structured, "response_format.json_schema.schema" if body.response_format else "tools")
            clash = [k for k in ("structured_outputs", "guided_json", "guided_regex", "guided_choice",
                                 "guided_grammar") if k in extras]
            if clash:
                what = "response_format" if body.response_format is not None else "tool_choice"
                raise bad_request(f"{clash[0]}: give it or {what}, not both", param=clash[0])
            extras["structured_outputs"] = structured
        # Only the entry (thinker) stage samples the user's text; later AR stages (a talker)
        # keep their deploy defaults. The request's fields go over the entry stage's, in the engine.
        values = {k: getattr(body, k) for k in _SAMPLING_FIELDS}
        values["max_tokens"] = body.max_completion_tokens or body.max_tokens
        values["logprobs"] = (body.top_logprobs or 0) if body.logprobs else None
        values["lora"] = body.lora  # the entry stage's adapter (native AR: ar/lora.py)
        # OpenAI's chat default: until the model stops (capped at max_model_len), unless the deploy sets one.
        params = entry_sampling_params(values, extras, fallback={"max_tokens": None})
        self._check_media_parts(body)
        prompt: dict[str, Any] = {"messages": [_message(m, i, media) for i, m in enumerate(body.messages)]}
        if body.tools and tool_mode is not None:
            prompt["tools"] = [t.model_dump(exclude_none=True) for t in body.tools]
        if body.audio is not None and body.audio.voice is not None:
            if not self.capabilities.serves("chat.audio"):
                raise bad_request("audio.voice: this model makes no audio", param="audio.voice")
            prompt["voice"] = body.audio.voice  # omni models read the voice from the prompt
        if body.mm_processor_kwargs is not None and body.mm_processor_kwargs.use_audio_in_video:
            prompt["use_audio_in_video"] = True
        return prompt, params, tool_mode

    def _check_media_parts(self, body: ChatCompletionRequest) -> None:
        """A media part the model has no encoder for is a 400 naming it (it was dropped silently)."""
        if self._media_inputs is _UNREAD:  # read from the checkpoint once, in the media pool
            self._media_inputs = media_inputs(self.settings.model_path)
        accepted = self._media_inputs
        if accepted is None:
            return
        for i, message in enumerate(body.messages):
            for j, part in enumerate(message.content if isinstance(message.content, list) else ()):
                needs = _PART_MEDIA.get(part.type)
                if needs is not None and needs not in accepted:
                    raise bad_request(f"messages[{i}].content[{j}]: model {self.capabilities.model!r} takes no "
                                      f"{needs} input (it reads {', '.join(['text', *sorted(accepted)])})",
                                      param=f"messages[{i}].content[{j}]", code="unsupported_modality")

    @staticmethod
    def _structured_outputs(body: ChatCompletionRequest, tool_mode: str | None) -> dict[str, Any] | None:
        """The grammar `response_format` or a forced tool call asks for, as structured_outputs."""
        fmt = body.response_format
        forced = tool_mode is not None and tool_mode != "auto"
        if fmt is not None and fmt.type != "text" and forced:
            raise bad_request("response_format: a forced tool call (tool_choice) already decides the output",
                              param="response_format")
        if forced:
            if tool_mode == "required":
                return {"json": tools.required_calls_schema([t.model_dump() for t in body.tools],
                                                            body.parallel_tool_calls is not False)}
            tool = next(t for t in body.tools if t.function.name == tool_mode)
            return {"json": tools.arguments_schema(tool.model_dump())}
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return {"json_object": True}
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise bad_request("response_format.json_schema: a json_schema format needs json_schema.schema",
                              param="response_format.json_schema")
        return {"json": fmt.json_schema.schema_}

    def _diffusion_request(self, body: ChatCompletionRequest, media: InputMedia) -> tuple[Any, DiffusionParams]:
        text_only = [k for k in ("max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "logprobs",
                                 "top_logprobs", "response_format", "tools", "tool_choice")
                     if getattr(body, k) is not None]
        if text_only:
            raise bad_request(f"{text_only[0]}: only text models take it", param=text_only[0])
        if body.n > 1:
            raise bad_request("n: an image model answers one chat message (use /v1/images/generations for more)",
                              param="n")
        width = height = None
        if body.size is not None and body.size != "auto":
            width, height = parse_size(body.size, self.settings)
        user = [i for i, m in enumerate(body.messages) if m.role == "user"]
        if not user:
            raise bad_request("messages: an image model needs a user message with the prompt", param="messages")
        index = user[-1]
        parts = _message(body.messages[index], index, media)["content"]
        if isinstance(parts, str):
            text, images = parts, []
        else:
            text = "\n".join(p["text"] for p in parts if p["type"] == "text")
            images = [p["image"] for p in parts if p["type"] == "image"]
            if any(p["type"] == "audio" for p in parts):
                raise bad_request(f"messages[{index}]: an image model takes no audio", param=f"messages[{index}]")
        if not text.strip():
            raise bad_request(f"messages[{index}]: the prompt text is empty", param=f"messages[{index}]")
        try:
            params = DiffusionParams(height=height, width=width, extras=body.extras(), **body.diffusion_fields())
        except ValueError as e:
            raise from_value_error(e) from None
        prompt = text if not images else {"prompt": text, "image": images if len(images) > 1 else images[0]}
        return prompt, params

    # --- answers -----------------------------------------------------------------------------

    def tool_answer(self, text: str | None, reason: str, tool_mode: str | None) -> tuple[Any, list | None, str]:
        """(content, tool calls in OpenAI's shape or None, finish_reason) of one choice's text."""
        if tool_mode is None or text is None:
            return text, None, reason
        calls: list[tools.ToolCall] = []
        content: str | None = text
        if tool_mode == "auto":
            content, calls = self.tool_parser.parse(text)
        elif reason == "stop":  # a forced call is complete JSON unless a length or abort cut it
            calls = tools.calls_from_required(text) if tool_mode == "required" else [tools.ToolCall(tool_mode, text)]
            content = None
        if not calls:
            return content, None, reason
        return content, [c.as_openai() for c in calls], "tool_calls"

    async def _complete(self, outs: list[Any], body: ChatCompletionRequest, request_id: str,
                        wants_audio: bool, tool_mode: str | None) -> ChatCompletion:
        choices = []
        for index, out in enumerate(outs):
            content, calls, reason = self.tool_answer(out.text, finish_reason(out), tool_mode)
            message = AssistantMessage(content=content, tool_calls=calls)
            if out.images:
                parts = await asyncio.to_thread(
                    lambda: [{"type": "image_url", "image_url": {"url": image_to_data_url(img)}} for img in out.images])
                message = AssistantMessage(content=parts)
            elif wants_audio and out.audio is not None:
                fmt = body.audio.format if body.audio else "wav"
                data = await asyncio.to_thread(encode_answer_audio, out.audio, out.sample_rate, fmt)
                message = AssistantMessage(audio=AudioAnswer(
                    id=f"audio_{uuid.uuid4().hex}", data=base64.b64encode(data).decode(),
                    expires_at=int(time.time() + self.settings.file_ttl_s), transcript=out.text or ""))
            choices.append(Choice(index=index, message=message, finish_reason=reason,
                                  logprobs=chat_logprobs(out.logprobs) if body.logprobs else None))
        return ChatCompletion(id=request_id, created=int(time.time()), model=self.settings.served_model_name,
                              choices=choices, usage=Usage(**usage(outs)))

    async def _sse(self, streams: list[RequestStream], body: ChatCompletionRequest, request_id: str,
                   wants_audio: bool, tool_mode: str | None) -> AsyncIterator[str]:
        created, model = int(time.time()), self.settings.served_model_name
        audio_id = f"audio_{uuid.uuid4().hex}"

        def chunk(index: int, delta: dict[str, Any], finish_reason: str | None = None,
                  logprobs: dict[str, Any] | None = None) -> str:
            return _sse_line({"id": request_id, "object": "chat.completion.chunk", "created": created,
                              "model": model, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                                           "finish_reason": finish_reason}]})

        finals: list[Any] = [None] * len(streams)
        held = [ContentGate(self.tool_parser.start if tool_mode == "auto" else None, tool_mode is not None)
                for _ in streams]
        try:
            for index in range(len(streams)):
                yield chunk(index, {"role": "assistant", "content": ""})
            async for index, out in merge_streams(streams):
                logprobs = chat_logprobs(out.logprobs_delta) if body.logprobs and out.logprobs_delta else None
                if out.text_delta:
                    if wants_audio:
                        yield chunk(index, {"audio": {"id": audio_id, "transcript": out.text_delta}}, None, logprobs)
                        logprobs = None
                    else:
                        text = held[index].feed(out.text_delta)
                        if text or logprobs:
                            yield chunk(index, {"content": text} if text else {}, None, logprobs)
                            logprobs = None
                if logprobs:
                    yield chunk(index, {}, None, logprobs)
                if wants_audio and out.audio_chunk is not None and len(out.audio_chunk):
                    pcm = to_pcm16(resample(out.audio_chunk, out.sample_rate, PCM16_RATE))
                    yield chunk(index, {"audio": {"id": audio_id, "data": base64.b64encode(pcm).decode()}})
                if out.finished:
                    finals[index] = out
            for index, final in enumerate(finals):
                if final is not None and final.images:
                    parts = await asyncio.to_thread(
                        lambda: [{"type": "image_url", "image_url": {"url": image_to_data_url(i)}}
                                 for i in final.images])
                    yield chunk(index, {"content": parts})
                if wants_audio:
                    expires_at = int(time.time() + self.settings.file_ttl_s)
                    yield chunk(index, {"audio": {"id": audio_id, "expires_at": expires_at}})
                content, calls, reason = self.tool_answer(final.text if final else None, finish_reason(final),
                                                           tool_mode)
                if calls:
                    for i, call in enumerate(calls):
                        yield chunk(index, {"tool_calls": [{**call, "index": i}]})
                else:
                    rest = held[index].rest(content)
                    if rest:
                        yield chunk(index, {"content": rest})
                yield chunk(index, {}, reason)
            if body.stream_options is not None and body.stream_options.include_usage:
                yield _sse_line({"id": request_id, "object": "chat.completion.chunk", "created": created,
                                 "model": model, "choices": [], "usage": usage(finals)})
        except APIError as e:
            yield _sse_line(e.body())
        yield "data: [DONE]\n\n"


class ContentGate:
    """Streamed content of one choice when tools may be called: text goes out until the
    parser's start marker (held back while the tail could be its start); after it, the
    rest waits for the parsed answer. A forced call (no marker) streams no content."""

    def __init__(self, marker: str | None, has_tools: bool) -> None:
        self.marker = marker
        self.closed = has_tools and marker is None
        self.sent = ""
        self._text = ""

    def feed(self, delta: str) -> str:
        self._text += delta
        if self.closed:
            return ""
        if self.marker is None:
            out, self.sent = self._text[len(self.sent):], self._text
            return out
        cut = self._text.find(self.marker)
        if cut >= 0:
            self.closed = True
            end = cut
        else:
            end = len(self._text)
            for k in range(min(len(self.marker) - 1, len(self._text)), 0, -1):
                if self._text.endswith(self.marker[:k]):
                    end -= k
                    break
        out, self.sent = self._text[len(self.sent):end], self._text[:end]
        return out

    def rest(self, content: str | None) -> str:
        """What is left to send once the answer is known to have no tool call."""
        if content is None:
            return ""
        return content[len(self.sent):] if content.startswith(self.sent) else ""


def _check_grammar(structured: dict[str, Any], param: str) -> None:
    """A schema from `response_format` or the tools that no grammar can follow is a 400 naming it."""
    try:
        StructuredOutputsParams.from_dict(structured).validate()
    except RequestError as e:  # named after structured_outputs; the client sent it as `param`
        raise bad_request(f"{param}: no grammar can follow it ({e.message})", param=param) from None


def _tool_mode(body: ChatCompletionRequest) -> str | None:
    """None (no tools, or tool_choice "none"), "auto", "required", or the forced function's name."""
    choice = body.tool_choice
    if not body.tools:
        if choice is not None and choice != "none":
            raise bad_request("tool_choice: needs tools", param="tool_choice")
        return None
    if choice is None or choice == "auto":
        return "auto"
    if choice == "none":
        return None
    if choice == "required":
        return "required"
    names = [t.function.name for t in body.tools]
    if choice.function.name not in names:
        raise bad_request(f"tool_choice.function.name: {choice.function.name!r} is not one of the tools {names}",
                          param="tool_choice.function.name")
    return choice.function.name


def _model_type(model_path: str) -> str | None:
    try:
        return json.loads((Path(model_path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def _message(message: ChatMessage, index: int, media: InputMedia) -> dict[str, Any]:
    """A message with its media fetched and decoded (within the server's limits; see
    media_inputs.py): content is a str, or a list of parts
    {"type": "text", "text"} | {"type": "image", "image": PIL} |
    {"type": "audio", "audio": float32 array, "sample_rate": int} | {"type": "video", "video": bytes}."""
    out: dict[str, Any] = {"role": message.role}
    if message.tool_calls:
        out["tool_calls"] = tools.template_tool_calls([c.model_dump() for c in message.tool_calls])
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.role == "tool" and message.name is not None:
        out["name"] = message.name
    content = message.content
    if content is None or isinstance(content, str):
        out["content"] = content or ""
        return out
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        where = f"messages[{index}].content[{j}]"
        try:
            if part.type == "text":
                parts.append({"type": "text", "text": part.text})
            elif part.type == "image_url":
                parts.append({"type": "image", "image": media.image_ref(part.image_url.url, f"{where}.image_url")})
            elif part.type == "video_url":
                parts.append({"type": "video", "video": media.video_ref(part.video_url.url, f"{where}.video_url")})
            else:
                raw = part.input_audio.data if part.type == "input_audio" else part.audio_url.url
                audio, rate = media.audio_ref(raw, f"{where}.{part.type}")
                parts.append({"type": "audio", "audio": audio, "sample_rate": rate})
        except ValueError as e:
            raise bad_request(str(e), param=where) from None
        except APIError as e:  # a media refusal (too large, URL not allowed): name the part
            raise APIError(e.status, e.message, param=where, code=e.code) from None
    if all(p["type"] == "text" for p in parts):
        out["content"] = "\n".join(p["text"] for p in parts)  # text-only chat templates take a string
    else:
        out["content"] = parts
    return out


def encode_answer_audio(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    if fmt == "pcm16":
        return to_pcm16(resample(audio, sample_rate, PCM16_RATE))
    return encode_audio(audio, sample_rate, _AUDIO_FORMATS[fmt])


def _sse_line(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
