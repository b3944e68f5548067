"""Chat completions: decode the messages' media, run the request, answer in OpenAI's shape.

What the answer holds follows the model's final stages:
- text (LLM): `message.content`; streamed as `delta.content`;
- text and audio (omni), with `modalities` naming "audio": `message.audio` (`data`
  base64 in `audio.format`, `transcript`), as OpenAI does; streamed as `delta.audio`
  with 24 kHz PCM16 `data` chunks and `transcript` pieces. Without "audio" the engine
  is asked for text only, so an omni model runs its thinker alone;
- image (diffusion): `message.content` as a list with one `image_url` part per image;
  the prompt is the last user message's text, its images the input images.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from omnistage.ar.sampling_params import SamplingParams
from omnistage.diffusion.params import DiffusionParams
from omnistage.entrypoints.openai.capabilities import Capabilities
from omnistage.entrypoints.openai.chat.protocol import (
    AssistantMessage,
    AudioAnswer,
    ChatCompletion,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    Usage,
)
from omnistage.entrypoints.openai.common import check_model, parse_size
from omnistage.entrypoints.openai.engine_client import (
    EngineGateway,
    RequestStream,
    cancel_on_disconnect,
    new_request_id,
    stage_default_params,
)
from omnistage.entrypoints.openai.errors import APIError, bad_request, from_value_error
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.media_inputs import InputMedia
from omnistage.media.audio import encode_audio, resample, to_pcm16
from omnistage.media.image import image_to_data_url

PCM16_RATE = 24000  # OpenAI's pcm16 is 24 kHz mono little-endian
_AUDIO_FORMATS = {"wav": "wav", "mp3": "mp3", "flac": "flac", "opus": "opus", "pcm16": "pcm"}
_SAMPLING_FIELDS = ("temperature", "top_p", "stop", "seed")


class ChatServing:
    def __init__(self, gateway: EngineGateway, capabilities: Capabilities, settings: ServerSettings):
        self.gateway = gateway
        self.capabilities = capabilities
        self.settings = settings

    async def create(self, body: ChatCompletionRequest, request: Any) -> ChatCompletion | AsyncIterator[str]:
        """A `ChatCompletion`, or the SSE lines of a streamed one (`stream: true`)."""
        self.capabilities.require("chat")
        check_model(body.model, self.settings)
        modalities = body.modalities or []
        wants_audio = "audio" in modalities
        if wants_audio:
            self.capabilities.require("chat.audio")
            if body.stream and body.audio is not None and body.audio.format != "pcm16":
                raise bad_request("audio.format: streamed audio is pcm16 only", param="audio.format")
        outputs = self.capabilities.outputs
        for modality in modalities:
            if modality not in outputs:
                raise bad_request(f"modalities: model {self.capabilities.model!r} outputs "
                                  f"{' and '.join(sorted(outputs))}, not {modality}", param="modalities")
        # The builders decode (and may fetch) the messages' media: in the media pool, off the loop.
        media = request.app.state.media
        if "image" in outputs:
            prompt, params = await media.run(self._diffusion_request, body, media)
            wanted = None
        else:
            prompt, params = await media.run(self._text_request, body, media)
            # The answer is text (or audio with its transcript): no stage makes more than that.
            wanted = ("text", "audio") if wants_audio else ("text",)
        request_id = new_request_id("chatcmpl")
        if body.stream:
            stream = await self.gateway.open(prompt, params, request_id, wanted)
            return self._sse(stream, body, request_id, wants_audio)

        async def go() -> ChatCompletion:
            stream = await self.gateway.open(prompt, params, request_id, wanted)
            return await self._complete(await stream.collect(), body, request_id, wants_audio)

        return await cancel_on_disconnect(request, go())

    # --- building the engine request -------------------------------------------------------

    def _text_request(self, body: ChatCompletionRequest, media: InputMedia) -> tuple[Any, dict[str, SamplingParams]]:
        image_only = [k for k in ("size", *body.diffusion_fields()) if k != "seed" and getattr(body, k) is not None]
        if image_only:
            raise bad_request(f"{image_only[0]}: only image models take it", param=image_only[0])
        if body.max_tokens is not None and body.max_completion_tokens is not None:
            raise bad_request("give max_tokens or max_completion_tokens, not both", param="max_tokens")
        # Only the entry (thinker) stage samples the user's text; later AR stages (a talker)
        # keep their deploy defaults. The request's fields go over the entry stage's.
        entry = self.gateway.engine.spec.entry_stages[0]
        values = stage_default_params(self.gateway.engine, entry.id)
        values.update({k: getattr(body, k) for k in _SAMPLING_FIELDS if getattr(body, k) is not None})
        max_tokens = body.max_completion_tokens or body.max_tokens
        if max_tokens is not None:
            values["max_tokens"] = max_tokens
        else:  # OpenAI's default is "until the model stops"; the engine caps it at max_model_len
            values.setdefault("max_tokens", None)
        values.update(body.extras())  # vLLM's extra sampling fields (top_k, min_p, ...)
        try:
            params = SamplingParams.from_dict(values)
        except ValueError as e:
            raise from_value_error(e) from None
        prompt: dict[str, Any] = {"messages": [_message(m, i, media) for i, m in enumerate(body.messages)]}
        if body.audio is not None and body.audio.voice is not None:
            if not self.capabilities.serves("chat.audio"):
                raise bad_request("audio.voice: this model makes no audio", param="audio.voice")
            prompt["voice"] = body.audio.voice  # omni models read the voice from the prompt
        return prompt, {entry.name: params}

    def _diffusion_request(self, body: ChatCompletionRequest, media: InputMedia) -> tuple[Any, DiffusionParams]:
        text_only = [k for k in ("max_tokens", "max_completion_tokens", "temperature", "top_p", "stop")
                     if getattr(body, k) is not None]
        if text_only:
            raise bad_request(f"{text_only[0]}: only text models take it", param=text_only[0])
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

    async def _complete(self, out: Any, body: ChatCompletionRequest, request_id: str,
                        wants_audio: bool) -> ChatCompletion:
        message = AssistantMessage(content=out.text)
        if out.images:
            parts = await asyncio.to_thread(
                lambda: [{"type": "image_url", "image_url": {"url": image_to_data_url(img)}} for img in out.images])
            message = AssistantMessage(content=parts)
        elif wants_audio and out.audio is not None:
            fmt = body.audio.format if body.audio else "wav"
            data = await asyncio.to_thread(_encode_answer_audio, out.audio, out.sample_rate, fmt)
            message = AssistantMessage(audio=AudioAnswer(
                id=f"audio_{uuid.uuid4().hex}", data=base64.b64encode(data).decode(),
                expires_at=int(time.time() + self.settings.file_ttl_s), transcript=out.text or ""))
        return ChatCompletion(id=request_id, created=int(time.time()), model=self.settings.served_model_name,
                              choices=[Choice(message=message, finish_reason=_finish_reason(out))],
                              usage=_usage(out))

    async def _sse(self, stream: RequestStream, body: ChatCompletionRequest, request_id: str,
                   wants_audio: bool) -> AsyncIterator[str]:
        created, model = int(time.time()), self.settings.served_model_name
        audio_id = f"audio_{uuid.uuid4().hex}"

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
            return _sse_line({"id": request_id, "object": "chat.completion.chunk", "created": created,
                              "model": model, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                           "finish_reason": finish_reason}]})

        try:
            yield chunk({"role": "assistant", "content": ""})
            final = None
            async for out in stream:
                if out.text_delta:
                    if wants_audio:
                        yield chunk({"audio": {"id": audio_id, "transcript": out.text_delta}})
                    else:
                        yield chunk({"content": out.text_delta})
                if wants_audio and out.audio_chunk is not None and len(out.audio_chunk):
                    pcm = to_pcm16(resample(out.audio_chunk, out.sample_rate, PCM16_RATE))
                    yield chunk({"audio": {"id": audio_id, "data": base64.b64encode(pcm).decode()}})
                final = out
            if final is not None and final.images:
                parts = await asyncio.to_thread(
                    lambda: [{"type": "image_url", "image_url": {"url": image_to_data_url(i)}} for i in final.images])
                yield chunk({"content": parts})
            if wants_audio:
                expires_at = int(time.time() + self.settings.file_ttl_s)
                yield chunk({"audio": {"id": audio_id, "expires_at": expires_at}})
            yield chunk({}, _finish_reason(final))
            if body.stream_options is not None and body.stream_options.include_usage:
                yield _sse_line({"id": request_id, "object": "chat.completion.chunk", "created": created,
                                 "model": model, "choices": [], "usage": _usage(final).model_dump()})
        except APIError as e:
            yield _sse_line(e.body())
        yield "data: [DONE]\n\n"


def _message(message: ChatMessage, index: int, media: InputMedia) -> dict[str, Any]:
    """A message with its media fetched and decoded (within the server's limits; see
    media_inputs.py): content is a str, or a list of parts
    {"type": "text", "text"} | {"type": "image", "image": PIL} |
    {"type": "audio", "audio": float32 array, "sample_rate": int}."""
    out: dict[str, Any] = {"role": message.role}
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


def _encode_answer_audio(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    if fmt == "pcm16":
        return to_pcm16(resample(audio, sample_rate, PCM16_RATE))
    return encode_audio(audio, sample_rate, _AUDIO_FORMATS[fmt])


def _finish_reason(out: Any) -> str:
    reason = getattr(out, "finish_reason", None) or "stop"
    return "stop" if reason == "abort" else reason


def _usage(out: Any) -> Usage:
    # The engine does not report prompt token counts yet: prompt_tokens stays 0.
    completion = len(out.token_ids or []) if out is not None else 0
    return Usage(completion_tokens=completion, total_tokens=completion)


def _sse_line(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
