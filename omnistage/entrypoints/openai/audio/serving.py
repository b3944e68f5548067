"""Speech: run the TTS request and answer audio bytes, chunked bytes or SSE events.

The engine prompt is `{"prompt": input}` plus `instructions` and `task_type` when given, and what the
voice store makes of `voice` (the name of a built-in voice, or a registered voice's
reference clip; see voices.py).
`pcm` and `wav` at speed 1 stream chunk by chunk as the model produces them (WAV with an
open-ended header); any other format, or another speed, is encoded once the whole
waveform exists and sent as one piece. `x-sample-rate` is the rate of the bytes sent
(48 kHz for opus, whose encoder runs at that rate).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from omnistage.entrypoints.openai.audio.protocol import SpeechRequest
from omnistage.entrypoints.openai.audio.voices import VoiceStore
from omnistage.entrypoints.openai.capabilities import Capabilities
from omnistage.entrypoints.openai.common import check_model
from omnistage.ar.sampling_params import SamplingParams
from omnistage.entrypoints.openai.engine_client import EngineGateway, RequestStream, new_request_id
from omnistage.entrypoints.openai.errors import APIError, EngineError, bad_request
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.media.audio import MIME_TYPES, StreamingAudioEncoder, change_speed, encode_audio

OPUS_RATE = 48000


@dataclass
class SpeechAnswer:
    """What the route sends: headers, and the body as bytes or an async iterator."""

    media_type: str
    sample_rate: int
    body: bytes | AsyncIterator[bytes | str]


class SpeechServing:
    def __init__(self, gateway: EngineGateway, capabilities: Capabilities, settings: ServerSettings,
                 voices: VoiceStore | None = None):
        self.gateway = gateway
        self.capabilities = capabilities
        self.settings = settings
        self.voices = voices or VoiceStore(builtin=None, can_clone=False)

    async def create(self, body: SpeechRequest) -> SpeechAnswer:
        stream, first = await self.start(body)
        chunked = body.response_format in ("pcm", "wav") and body.speed == 1.0
        rate = first.sample_rate
        out_rate = OPUS_RATE if body.response_format == "opus" else rate
        if body.stream_format == "sse":
            return SpeechAnswer("text/event-stream", out_rate, self._sse(stream, first, body, chunked))
        if chunked:
            return SpeechAnswer(MIME_TYPES[body.response_format], rate, self._chunks(stream, first, body))
        audio = await _whole(stream, first)
        data = await asyncio.to_thread(_encode_whole, audio, rate, body)
        return SpeechAnswer(MIME_TYPES[body.response_format], out_rate, data)

    async def start(self, body: SpeechRequest) -> tuple[RequestStream, Any]:
        """Check the request, send it to the engine, and wait for its first audio."""
        self.capabilities.require("audio.speech")
        check_model(body.model, self.settings)
        if body.response_format == "opus" and not opus_available():
            raise bad_request("response_format: this server's PyAV has no libopus; use wav, pcm, flac or mp3",
                              param="response_format")
        if body.ref_text is not None and body.ref_audio is None:
            raise bad_request("ref_text: goes with ref_audio", param="ref_text")
        if body.ref_audio is not None:  # it overrides `voice`, which the official client always sends
            voice_fields = await asyncio.to_thread(self.voices.inline_clone_fields, body.ref_audio, body.ref_text)
        else:
            voice_fields = self.voices.prompt_fields(body.voice)
        prompt = {"prompt": body.input, **voice_fields}
        if body.instructions is not None:
            prompt["instructions"] = body.instructions
        if body.task_type is not None:
            prompt["task_type"] = body.task_type
        stream = await self.gateway.open(prompt, self._params(body), new_request_id("speech"))
        try:
            first = await _first_audio(stream)
        except BaseException:
            await stream.close()
            raise
        return stream, first

    def _params(self, body: SpeechRequest) -> dict[str, SamplingParams] | None:
        """The seed goes to the entry AR stage (the talker); the engine fills the rest from its deploy defaults."""
        if body.seed is None:
            return None
        entry = self.gateway.engine.spec.entry_stages[0]
        if entry.kind != "ar":
            raise bad_request("seed: this model's speech is not sampled", param="seed")
        return {entry.name: SamplingParams(seed=body.seed)}

    async def _chunks(self, stream: RequestStream, first: Any, body: SpeechRequest) -> AsyncIterator[bytes]:
        encoder = StreamingAudioEncoder(first.sample_rate, body.response_format)
        async for chunk in audio_chunks(stream, first):
            yield encoder.encode(chunk)

    async def _sse(self, stream: RequestStream, first: Any, body: SpeechRequest,
                   chunked: bool) -> AsyncIterator[str]:
        num_bytes = 0
        finished: list[Any] = []
        try:
            if chunked:
                encoder = StreamingAudioEncoder(first.sample_rate, body.response_format)
                async for chunk in audio_chunks(stream, first, finished):
                    data = encoder.encode(chunk)
                    num_bytes += len(data)
                    yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
            else:
                audio = await _whole(stream, first, finished)
                data = await asyncio.to_thread(_encode_whole, audio, first.sample_rate, body)
                num_bytes = len(data)
                yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
            yield _event({"type": "speech.audio.done", "usage": speech_usage(body.input, finished[-1] if finished
                                                                             else None, body.speed),
                          "num_bytes": num_bytes})
        except APIError as e:
            yield _event({"type": "error", **e.body()})


async def _first_audio(stream: RequestStream) -> Any:
    """Outputs up to the first that carries audio (its sample rate makes the headers)."""
    while (out := await stream.next()) is not None:
        if out.audio_chunk is not None or out.audio is not None:
            return out
    raise EngineError("the model produced no audio")


def speech_usage(text: str, final: Any, speed: float = 1.0) -> dict[str, Any]:
    """OpenAI's token usage (input: the prompt as the talker tokenized it; output: the codes
    it sampled), with the input's characters and the seconds of audio made."""
    metrics = (getattr(final, "metrics", None) or {}) if final is not None else {}
    input_tokens = int(metrics.get("num_prompt_tokens") or 0)
    output_tokens = sum(int(m.get("num_generated_tokens") or 0) for m in metrics.get("stages", {}).values()
                        if m.get("num_generated_tokens"))
    audio = getattr(final, "audio", None)
    seconds = len(audio) / final.sample_rate / speed if audio is not None and final.sample_rate else 0.0
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "total_tokens": input_tokens + output_tokens,
            "input_characters": len(text), "audio_seconds": round(seconds, 3)}


async def audio_chunks(stream: RequestStream, first: Any, finished: list[Any] | None = None) -> AsyncIterator[np.ndarray]:
    """Every new piece of audio from `first` on; the finished output's whole waveform
    counts only for what no chunk carried (and it is appended to `finished`). Closes the
    stream (aborting it if unfinished)."""
    sent = 0
    out = first
    try:
        while out is not None:
            if out.finished and finished is not None:
                finished.append(out)
            chunk = out.audio_chunk
            if chunk is None and out.finished and out.audio is not None:
                chunk = out.audio[sent:]
            if chunk is not None and len(chunk):
                sent += len(chunk)
                yield chunk
            out = await stream.next()
    finally:
        await stream.close()


async def _whole(stream: RequestStream, first: Any, finished: list[Any] | None = None) -> np.ndarray:
    pieces = [c async for c in audio_chunks(stream, first, finished)]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)


def _encode_whole(audio: np.ndarray, sample_rate: int, body: SpeechRequest) -> bytes:
    return encode_audio(change_speed(audio, body.speed), sample_rate, body.response_format)


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


@cache
def opus_available() -> bool:
    try:
        encode_audio(np.zeros(480, dtype=np.float32), OPUS_RATE, "opus")
    except Exception:  # PyAV missing, or built without libopus
        return False
    return True
