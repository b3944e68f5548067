"""Audio generation: a description -> sound or music, from a diffusion audio model (Stable Audio).

The prompt and the diffusion fields go to the diffusion stage as `DiffusionParams`; vLLM-Omni's
names `input` and `audio_length` are taken for `prompt` and `duration_seconds`, which
becomes the model's `audio_end_in_s` extra (after `audio_start_in_s`,
0 unless sent). The whole waveform is encoded once in `response_format` with the speech
route's encoders (media/audio.py): mono or the model's channels (`x-audio-channels`), at
the model's rate (`x-sample-rate`; 48 kHz for opus, whose encoder runs at that rate).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
from starlette.requests import Request

from omnistage.diffusion.params import DiffusionParams
from omnistage.entrypoints.openai.audio.protocol import AudioGenerateRequest
from omnistage.entrypoints.openai.audio.serving import OPUS_RATE, opus_available
from omnistage.entrypoints.openai.capabilities import Capabilities
from omnistage.entrypoints.openai.common import check_model
from omnistage.entrypoints.openai.engine_client import EngineGateway, new_request_id
from omnistage.entrypoints.openai.errors import APIError, EngineError, bad_request, from_value_error
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.media.audio import MIME_TYPES, encode_audio

# The model's extras that say which seconds of its window to keep.
START_EXTRA, END_EXTRA = "audio_start_in_s", "audio_end_in_s"


@dataclass
class GeneratedAudio:
    media_type: str
    sample_rate: int
    num_channels: int
    body: bytes


class AudioGenerateServing:
    def __init__(self, gateway: EngineGateway, capabilities: Capabilities, settings: ServerSettings):
        self.gateway = gateway
        self.capabilities = capabilities
        self.settings = settings

    async def create(self, body: AudioGenerateRequest, request: Request) -> GeneratedAudio:
        self.capabilities.require("audio.generate")
        check_model(body.model, self.settings)
        if body.response_format == "opus" and not opus_available():
            raise bad_request("response_format: this server's PyAV has no libopus; use wav, pcm, flac or mp3",
                              param="response_format")
        prompt, params = body.text(), self._params(body)
        try:
            out = await self.gateway.run(prompt, params, new_request_id("audio"), request)
        except APIError as e:
            # The engine checks the end second it was given; the client sent a duration.
            if e.param == END_EXTRA and body.seconds() is not None:
                name = "duration_seconds" if body.duration_seconds is not None else "audio_length"
                raise bad_request(f"{name}: {e.message}", param=name) from None
            raise
        if out.audio is None:
            raise EngineError("the model produced no audio")
        audio = np.asarray(out.audio, dtype=np.float32)
        data = await asyncio.to_thread(encode_audio, audio, out.sample_rate, body.response_format)
        rate = OPUS_RATE if body.response_format == "opus" else out.sample_rate
        return GeneratedAudio(MIME_TYPES[body.response_format], rate, 1 if audio.ndim == 1 else audio.shape[1], data)

    def _params(self, body: AudioGenerateRequest) -> DiffusionParams:
        extras = body.extras()
        seconds = body.seconds()
        if seconds is not None:
            if END_EXTRA in extras:
                raise bad_request(f"duration_seconds: give duration_seconds or {END_EXTRA}, not both",
                                  param="duration_seconds")
            start = extras.get(START_EXTRA, 0.0)
            if isinstance(start, bool) or not isinstance(start, int | float):
                raise bad_request(f"{START_EXTRA} must be a number, got {type(start).__name__}", param=START_EXTRA)
            extras[END_EXTRA] = float(start) + seconds
        try:
            return DiffusionParams(extras=extras, **body.diffusion_fields())
        except ValueError as e:
            raise from_value_error(e) from None
