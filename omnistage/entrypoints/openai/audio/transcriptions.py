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

A speech recognition family (its spec's `speech_to_text`, e.g. Qwen3-ASR) is asked in its
own way instead: its `prompt` builds the request from the audio, `language` and `prompt`, and
its `parse` says which part of the generated text is transcript (the rest, such as a detected
language tag, is neither answered nor streamed; the language it names goes in verbose_json).
Such a model gives no times, so `timestamp_granularities` is refused.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable
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
from omnistage.entrypoints.openai.errors import APIError, bad_request, from_value_error
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
        stt = getattr(self.gateway.engine.spec, "speech_to_text", None)
        if not translate:
            if stt is not None and body.timestamp_granularities is not None:
                raise bad_request("timestamp_granularities: this model gives no times",
                                  param="timestamp_granularities")
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
        language = None if translate else body.language
        read = functools.partial(stt.parse, language=language) if stt is not None else _whole_text
        request_id = new_request_id("translation" if translate else "transcript")
        if not translate and body.stream:
            stream = await self.gateway.open(prompt, params, request_id, ("text",))
            return Transcript("text/event-stream", _events(stream, read))

        async def go() -> Any:
            return await (await self.gateway.open(prompt, params, request_id, ("text",))).collect()

        final = await cancel_on_disconnect(request, go())  # a client that leaves aborts the request
        spoken, text = read(final.text or "", final=True)
        return _answer(body, text, spoken, len(audio) / rate, final)


def transcription_request(gateway: EngineGateway, audio: Any, rate: int, language: str | None = None,
                          context: str | None = None, temperature: float = 0.0,
                          translate: bool = False) -> tuple[Any, dict]:
    """(prompt, params by stage) asking the model for the transcript of `audio` (also what a
    realtime session's input transcription runs), or with `translate` for its English
    translation; the request is to want ("text",) only. A speech recognition family builds its
    own prompt (`SpeechToText.prompt`); an omni thinker gets a chat message with an instruction."""
    stt = getattr(gateway.engine.spec, "speech_to_text", None)
    params = entry_sampling_params({"temperature": temperature}, {}, fallback={"max_tokens": None})
    params = {gateway.engine.spec.entry_stages[0].name: params}
    if stt is not None and not translate:
        try:
            return stt.prompt(audio, rate, language, context), params
        except ValueError as e:  # a RequestError naming `language`
            raise from_value_error(e) from None
    if translate:
        text = "Translate the speech in this audio into English text. Answer with the translation only."
    else:
        language_part = f" in the language {language!r}" if language else ""
        text = f"Transcribe the speech in this audio into text{language_part}. Answer with the transcript only."
    if context:
        text += f" It follows on from: {context}"
    prompt = {"messages": [{"role": "user", "content": [
        {"type": "audio", "audio": audio, "sample_rate": rate}, {"type": "text", "text": text}]}]}
    return prompt, params


def _whole_text(text: str, final: bool = True) -> tuple[None, str]:
    """An omni thinker's answer is all transcript (it names no language)."""
    return None, text.strip()


def usage(out: Any) -> dict[str, Any]:
    prompt, completion = prompt_tokens(out), completion_tokens(out)
    return {"type": "tokens", "input_tokens": prompt, "output_tokens": completion,
            "total_tokens": prompt + completion}


def _answer(body: TranscriptionRequest | TranslationRequest, text: str, spoken: str | None, seconds: float,
            final: Any) -> Transcript:
    fmt = body.response_format
    if fmt == "text":
        return Transcript("text/plain", text)
    if fmt == "json":
        return Transcript("application/json", json.dumps({"text": text, "usage": usage(final)}))
    if fmt == "verbose_json":
        segment = {"id": 0, "seek": 0, "start": 0.0, "end": round(seconds, 3), "text": text,
                   "tokens": list(final.token_ids or []), "temperature": body.temperature}
        translate = isinstance(body, TranslationRequest)
        language = "english" if translate else (spoken or body.language or "unknown").lower()
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


async def _events(stream: RequestStream, read: Callable[..., tuple[str | None, str]]) -> AsyncIterator[str]:
    """Deltas of the transcript as `read` finds it in the text so far (with the whole text, a
    delta is the text's own; a family's language tag is held back until the transcript starts)."""
    final, sent = None, ""
    try:
        async for out in stream:
            if out.finished:
                final = out
            _, so_far = read(out.text or "", final=out.finished)
            if out.text_delta and so_far.startswith(sent) and len(so_far) > len(sent):
                yield _sse({"type": "transcript.text.delta", "delta": so_far[len(sent):]})
                sent = so_far
        yield _sse({"type": "transcript.text.done", "text": read(final.text or "", final=True)[1] if final else "",
                    "usage": usage(final)})
    except APIError as e:
        yield _sse(e.body())


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
