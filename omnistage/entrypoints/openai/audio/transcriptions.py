"""Transcriptions: speech -> its text, by an omni model's thinker (POST /v1/audio/transcriptions),
and translations: speech in any language -> English text (POST /v1/audio/translations).

The upload is decoded within the server's input limits (media_inputs.py) and sent to the
thinker alone (modalities ["text"]: no talker, no vocoder) as a user message of the
audio and an instruction to transcribe it, in `language` when given, after `prompt` as
context. Answers, by `response_format`:

    json           {"text", "usage"}
    text           the text
    verbose_json   {"task", "language", "duration", "text", "segments", "usage"}
    srt, vtt       subtitles

A translation is the same request with an instruction to answer in English, and takes no
`language`, `stream` or `timestamp_granularities` (as OpenAI's).
The thinkers give no times: verbose_json, srt and vtt hold one segment, the whole clip.
`stream: true` (json and text) sends SSE `transcript.text.delta` events, then
`transcript.text.done` with the text and usage, as OpenAI's streamed transcriptions do.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request

from omnistage.entrypoints.openai.audio.protocol import TranscriptionRequest, TranslationRequest
from omnistage.entrypoints.openai.capabilities import Capabilities
from omnistage.entrypoints.openai.common import check_model, read_upload
from omnistage.entrypoints.openai.engine_client import (
    EngineGateway,
    RequestStream,
    cancel_on_disconnect,
    new_request_id,
)
from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.entrypoints.openai.media_inputs import InputMedia
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.text_generation import completion_tokens, entry_sampling_params, prompt_tokens


@dataclass
class Transcript:
    media_type: str
    body: str | AsyncIterator[str]


class TranscriptionServing:
    def __init__(self, gateway: EngineGateway, capabilities: Capabilities, settings: ServerSettings):
        self.gateway = gateway
        self.capabilities = capabilities
        self.settings = settings

    async def create(self, body: TranscriptionRequest | TranslationRequest, upload: UploadFile,
                     request: Request) -> Transcript:
        translate = isinstance(body, TranslationRequest)
        self.capabilities.require("audio.translations" if translate else "audio.transcriptions")
        check_model(body.model, self.settings)
        if not translate:
            if body.stream and body.response_format not in ("json", "text"):
                raise bad_request("response_format: a streamed transcription is json or text",
                                  param="response_format")
            if body.timestamp_granularities is not None and body.response_format != "verbose_json":
                raise bad_request("timestamp_granularities: needs response_format verbose_json",
                                  param="timestamp_granularities")
        media: InputMedia = request.app.state.media
        audio, rate = await media.audio(await read_upload(upload, "file"), "file")
        prompt, params = transcription_request(self.gateway, audio, rate, None if translate else body.language,
                                               body.prompt, body.temperature, translate=translate)
        request_id = new_request_id("translation" if translate else "transcript")
        if not translate and body.stream:
            stream = await self.gateway.open(prompt, params, request_id, ("text",))
            return Transcript("text/event-stream", _events(stream))

        async def go() -> Any:
            return await (await self.gateway.open(prompt, params, request_id, ("text",))).collect()

        final = await cancel_on_disconnect(request, go())  # a client that leaves aborts the request
        return _answer(body, (final.text or "").strip(), len(audio) / rate, final)


def transcription_request(gateway: EngineGateway, audio: Any, rate: int, language: str | None = None,
                          context: str | None = None, temperature: float = 0.0,
                          translate: bool = False) -> tuple[dict, dict]:
    """(prompt, params by stage) asking the thinker for the transcript of `audio` (also what a
    realtime session's input transcription runs), or with `translate` for its English
    translation; the request is to want ("text",) only."""
    if translate:
        text = "Translate the speech in this audio into English text. Answer with the translation only."
    else:
        language_part = f" in the language {language!r}" if language else ""
        text = f"Transcribe the speech in this audio into text{language_part}. Answer with the transcript only."
    if context:
        text += f" It follows on from: {context}"
    prompt = {"messages": [{"role": "user", "content": [
        {"type": "audio", "audio": audio, "sample_rate": rate}, {"type": "text", "text": text}]}]}
    params = entry_sampling_params({"temperature": temperature}, {}, fallback={"max_tokens": None})
    return prompt, {gateway.engine.spec.entry_stages[0].name: params}


def usage(out: Any) -> dict[str, Any]:
    prompt, completion = prompt_tokens(out), completion_tokens(out)
    return {"type": "tokens", "input_tokens": prompt, "output_tokens": completion,
            "total_tokens": prompt + completion}


def _answer(body: TranscriptionRequest | TranslationRequest, text: str, seconds: float, final: Any) -> Transcript:
    fmt = body.response_format
    if fmt == "text":
        return Transcript("text/plain", text)
    if fmt == "json":
        return Transcript("application/json", json.dumps({"text": text, "usage": usage(final)}))
    if fmt == "verbose_json":
        segment = {"id": 0, "seek": 0, "start": 0.0, "end": round(seconds, 3), "text": text,
                   "tokens": list(final.token_ids or []), "temperature": body.temperature}
        translate = isinstance(body, TranslationRequest)
        language = "english" if translate else body.language or "unknown"
        return Transcript("application/json", json.dumps({
            "task": "translate" if translate else "transcribe", "language": language, "duration": round(seconds, 3),
            "text": text, "segments": [segment], "usage": usage(final)}))
    if fmt == "srt":
        return Transcript("text/plain", f"1\n{_clock(0, ',')} --> {_clock(seconds, ',')}\n{text}\n")
    return Transcript("text/vtt", f"WEBVTT\n\n{_clock(0, '.')} --> {_clock(seconds, '.')}\n{text}\n")


def _clock(seconds: float, mark: str) -> str:
    """HH:MM:SS,mmm (SRT) or HH:MM:SS.mmm (WebVTT)."""
    ms = int(round(seconds * 1000))
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{mark}{ms % 1000:03d}"


async def _events(stream: RequestStream) -> AsyncIterator[str]:
    final = None
    try:
        async for out in stream:
            if out.text_delta:
                yield _sse({"type": "transcript.text.delta", "delta": out.text_delta})
            if out.finished:
                final = out
        yield _sse({"type": "transcript.text.done", "text": (final.text or "").strip() if final else "",
                    "usage": usage(final)})
    except APIError as e:
        yield _sse(e.body())


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
