"""Speech: run the TTS request and answer audio bytes, chunked bytes or SSE events; and the
batch of many speech requests answered in one JSON response.

The engine prompt is `{"prompt": input}` plus `instructions`, `task_type` and the model's
declared extras when given (`PipelineSpec.request_extras`, as fields or in vLLM-Omni's
`extra_params`; unknown fields are a 400 naming them), and what the voice store makes of
`voice` (the name of a built-in voice, or a registered voice's reference clip; see
voices.py). `seed` and `max_new_tokens` go to the talker's sampling params; an entry
diffusion stage (OmniVoice's) takes `seed`, `num_inference_steps`, `guidance_scale` and its
pipeline's extras instead, checked by the engine. `word_timestamps` is a 400: no served
family produces alignments.
`pcm` and `wav` at speed 1 stream chunk by chunk as the model produces them (WAV with an
open-ended header); any other format, or another speed, is encoded once the whole
waveform exists and sent as one piece. `stream: true` asks for the first kind and is a 400
for the second. `x-sample-rate` is the rate of the bytes sent (48 kHz for opus, whose
encoder runs at that rate). A client that leaves mid-stream aborts the engine request (the
route's generator is cancelled; `audio_chunks` closes the stream).
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

from omnistage.entrypoints.openai.audio.protocol import (
    STREAMABLE_FORMATS,
    SpeechBatchRequest,
    SpeechBatchResponse,
    SpeechBatchResult,
    SpeechRequest,
)
from omnistage.entrypoints.openai.audio.voices import VoiceStore
from omnistage.entrypoints.openai.capabilities import Capabilities
from omnistage.entrypoints.openai.common import check_model, validate
from omnistage.ar.sampling_params import SamplingParams
from omnistage.entrypoints.openai.engine_client import (
    EngineGateway,
    RequestStream,
    cancel_on_disconnect,
    new_request_id,
)
from omnistage.entrypoints.openai.errors import APIError, EngineError, bad_request, from_value_error
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.media.audio import MIME_TYPES, StreamingAudioEncoder, change_speed, encode_audio

OPUS_RATE = 48000
DENOISE_FIELDS = ("num_inference_steps", "guidance_scale")
"""Request fields an entry diffusion stage takes from a speech request (OmniVoice's steps and CFG scale)."""


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
        if body.stream:
            _check_streamable(body)
        stream, first = await self.start(body)
        chunked = body.response_format in STREAMABLE_FORMATS and body.speed == 1.0
        rate = first.sample_rate
        out_rate = OPUS_RATE if body.response_format == "opus" else rate
        if body.stream_format == "sse":
            return SpeechAnswer("text/event-stream", out_rate, self._sse(stream, first, body, chunked, out_rate))
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
        refuse_word_timestamps(body.word_timestamps)
        if body.ref_text is not None and body.ref_audio is None:
            raise bad_request("ref_text: goes with ref_audio", param="ref_text")
        extras, stage_extras = self._model_extras(body)
        params = self._params(body, stage_extras)
        if body.ref_audio is not None:  # it overrides `voice`, which the official client always sends
            voice_fields = await asyncio.to_thread(self.voices.inline_clone_fields, body.ref_audio, body.ref_text)
        else:
            voice_fields = self.voices.prompt_fields(body.voice)
        prompt = {"prompt": body.input, **voice_fields, **extras}
        if body.instructions is not None:
            prompt["instructions"] = body.instructions
        if body.task_type is not None:
            prompt["task_type"] = body.task_type
        stream = await self.gateway.open(prompt, params, new_request_id("speech"))
        try:
            first = await _first_audio(stream)
        except BaseException:
            await stream.close()
            raise
        return stream, first

    def _model_extras(self, body: SpeechRequest) -> tuple[dict[str, Any], dict[str, Any]]:
        """The fields the body sent beyond the route's (or in vLLM-Omni's `extra_params`), as
        (prompt extras, entry-stage extras). An extra the model declares goes to the prompt,
        checked against its type and range. Before an entry diffusion stage (OmniVoice) the rest
        are that stage's (`num_inference_steps`, `guidance_scale` and its pipeline's extras),
        which the engine checks by name; otherwise the rest are a 400 naming the field."""
        declared = getattr(self.gateway.engine.spec, "request_extras", None) or {}
        takes = sorted(name for name in declared if name not in SpeechRequest.model_fields)
        to_stage = self._entry().kind == "diffusion"
        extras, stage_extras = {}, {}
        for name, value in _extra_fields(body).items():
            if name in takes:
                try:
                    extras[name] = declared[name].check(name, value)
                except ValueError as e:
                    raise from_value_error(e) from None
            elif to_stage:
                stage_extras[name] = value
            else:
                raise bad_request(f"{name}: unknown field; this model's extras are {takes}", param=name)
        return extras, stage_extras

    def _entry(self) -> Any:
        return self.gateway.engine.spec.entry_stages[0]

    def _params(self, body: SpeechRequest, stage_extras: dict[str, Any]) -> dict[str, Any] | None:
        """`seed` and `max_new_tokens` go to the entry AR stage (the talker); `seed` and the
        stage's fields to an entry diffusion stage (one that unmasks or denoises the codes: its
        length is the model's estimate, not a token budget). The engine fills the rest from its
        deploy defaults."""
        given = {"seed": body.seed, "max_tokens": body.max_new_tokens}
        given = {k: v for k, v in given.items() if v is not None}
        entry = self._entry()
        if entry.kind == "diffusion":
            from omnistage.diffusion.params import DiffusionParams

            if body.max_new_tokens is not None:
                raise bad_request("max_new_tokens: this model's speech length comes from the text, not a token "
                                  "budget", param="max_new_tokens")
            if body.seed is None and not stage_extras:
                return None
            fields = {name: stage_extras.pop(name) for name in DENOISE_FIELDS if name in stage_extras}
            try:
                return {entry.name: DiffusionParams(seed=body.seed, extras=stage_extras, **fields)}
            except ValueError as e:
                raise from_value_error(e) from None
        if not given:
            return None
        if entry.kind != "ar":
            name = "seed" if body.seed is not None else "max_new_tokens"
            raise bad_request(f"{name}: this model's speech is not sampled", param=name)
        return {entry.name: SamplingParams(**given)}

    async def create_batch(self, body: SpeechBatchRequest, request: Any) -> SpeechBatchResponse:
        """Every item as its own speech request, all submitted together (the engine batches
        them); each answered whole, with its own status: a bad item fails alone."""
        self.capabilities.require("audio.speech")
        check_model(body.model, self.settings)
        shared = body.model_dump(exclude={"items"}, exclude_none=True)
        _check_whole(shared)
        # The shared fields' own errors fail the whole batch.
        refuse_word_timestamps(shared.get("word_timestamps"))
        self._model_extras(validate(SpeechRequest, {**shared, "input": "-"}))
        request_id = new_request_id("speechbatch")

        async def one(index: int, item: dict[str, Any]) -> SpeechBatchResult:
            try:
                _check_whole(item)
                speech = validate(SpeechRequest, {**shared, **item})
                stream, first = await self.start(speech)
                finished: list[Any] = []
                audio = await _whole(stream, first, finished)
                data = await asyncio.to_thread(_encode_whole, audio, first.sample_rate, speech)
            except (APIError, ValueError) as e:
                error = (e if isinstance(e, APIError) else from_value_error(e)).body()["error"]
                error["param"] = f"items[{index}].{error['param']}" if error.get("param") else f"items[{index}]"
                return SpeechBatchResult(index=index, status="error", error=error)
            rate = OPUS_RATE if speech.response_format == "opus" else first.sample_rate
            usage = speech_usage(speech.input, finished[-1] if finished else None, speech.speed)
            return SpeechBatchResult(index=index, status="success", audio_data=base64.b64encode(data).decode(),
                                     media_type=MIME_TYPES[speech.response_format], sample_rate=rate, usage=usage)

        async def run_all() -> list[SpeechBatchResult]:
            return list(await asyncio.gather(*(one(i, item) for i, item in enumerate(body.items))))

        results = await cancel_on_disconnect(request, run_all())
        succeeded = sum(r.status == "success" for r in results)
        return SpeechBatchResponse(id=request_id, results=results, total=len(results), succeeded=succeeded,
                                   failed=len(results) - succeeded)

    async def _chunks(self, stream: RequestStream, first: Any, body: SpeechRequest) -> AsyncIterator[bytes]:
        encoder = StreamingAudioEncoder(first.sample_rate, body.response_format)
        async for chunk in audio_chunks(stream, first):
            yield encoder.encode(chunk)

    async def _sse(self, stream: RequestStream, first: Any, body: SpeechRequest,
                   chunked: bool, rate: int) -> AsyncIterator[str]:
        num_bytes = 0
        finished: list[Any] = []
        # vLLM-Omni's delta fields beside OpenAI's `audio`: what the bytes are.
        about = {"response_format": body.response_format, "sample_rate": rate, "channels": 1}
        try:
            if chunked:
                encoder = StreamingAudioEncoder(first.sample_rate, body.response_format)
                async for chunk in audio_chunks(stream, first, finished):
                    data = encoder.encode(chunk)
                    num_bytes += len(data)
                    yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode(), **about})
            else:
                audio = await _whole(stream, first, finished)
                data = await asyncio.to_thread(_encode_whole, audio, first.sample_rate, body)
                num_bytes = len(data)
                yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode(), **about})
            yield _event({"type": "speech.audio.done", "usage": speech_usage(body.input, finished[-1] if finished
                                                                             else None, body.speed),
                          "num_bytes": num_bytes})
        except APIError as e:
            yield _event({"type": "error", **e.body()})


def refuse_word_timestamps(asked: Any) -> None:
    """No served family produces alignments (vLLM-Omni's come from a separate forced aligner)."""
    if asked:
        raise bad_request("word_timestamps: no speech model served here produces word alignments",
                          param="word_timestamps")


def _extra_fields(body: SpeechRequest) -> dict[str, Any]:
    """The body's fields beyond the route's, with vLLM-Omni's `extra_params` merged in."""
    fields = dict(body.model_extra or {})
    for name, value in (body.extra_params or {}).items():
        if name in SpeechRequest.model_fields:
            raise bad_request(f"extra_params.{name}: a field of the speech request; send it as one",
                              param=f"extra_params.{name}")
        if name in fields and fields[name] != value:
            raise bad_request(f"{name}: given as a field and in extra_params with different values "
                              f"({fields[name]!r} vs {value!r}); send one", param=name)
        fields[name] = value
    return fields


def _check_whole(fields: dict[str, Any]) -> None:
    """Batch items are answered whole (base64 in JSON): no streaming asked of them."""
    for name, streamed in (("stream", True), ("stream_format", "sse")):
        if fields.get(name) == streamed:
            raise bad_request(f"{name}: batch items are answered whole, as base64 audio_data", param=name)


def _check_streamable(body: SpeechRequest) -> None:
    """`stream: true`: the audio must leave as it is made, which only pcm and wav at speed 1 can."""
    if body.response_format not in STREAMABLE_FORMATS:
        raise bad_request(f"response_format: {body.response_format!r} is encoded once the audio is complete; "
                          f"stream: true takes {list(STREAMABLE_FORMATS)}", param="response_format")
    if body.speed != 1.0:
        raise bad_request("speed: changing the speed needs the whole audio; stream: true takes speed 1",
                          param="speed")


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
