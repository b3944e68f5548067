"""One WebSocket of WS /v1/video/chat/stream: frames and audio in, answers out.

Client -> server (JSON text messages, protocol.py):

    {"type": "session.config", "modalities", "num_frames", "max_frames", "system_prompt", ...}
    {"type": "video.frame", "image": base64 JPEG/PNG, "frame_id"?, "pts_ms"?}
    {"type": "audio.chunk", "audio": base64 PCM16 24 kHz mono}
    {"type": "video.query", "text"?, "audio"?}

Server -> client (names as WS /v1/realtime's where they mean the same):

    session.created / session.updated    {"session": the config}
    video.frames.prefilled               {"frame_ids", "frames"}: the buffered frames now prefilled
    video.frames.consumed                {"frame_ids", "frames", "latest_pts_ms"}: what the query sees
    response.created                     {"response"}
    response.output_text.delta           {"response_id", "delta"}            (modalities ["text"])
    response.output_audio_transcript.delta, response.output_audio.delta      (["text", "audio"])
    response.done                        {"response": status, output text, usage with cached_tokens}
    error                                {"error": {"type", "code", "message", "param", "event_id"}}

Frames wait in a bounded buffer (`max_frames`) until a query takes up to `num_frames` of
them, oldest first; a near repeat of the last kept frame is dropped when the filter is on.
The conversation (frames, audio, question, answer) stays across queries, so a query sees
the ones before it. While frames arrive, the prompt so far is prefilled (prefix_warmer.py).
A bad event gets an `error` naming the field and the session goes on. The session's length
and idle time are WS /v1/realtime's limits; when the client goes, its running answer and
warm-up are aborted in the engine.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from omnistage.entrypoints.openai.common import event_object, typed_event
from omnistage.entrypoints.openai.engine_client import EngineGateway
from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.entrypoints.openai.media_inputs import InputMedia
from omnistage.entrypoints.openai.prefix_warmer import PrefixWarmer
from omnistage.entrypoints.openai.realtime import audio_format
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.video_chat.answer import Answer, stage_params
from omnistage.entrypoints.openai.video_chat.context import Context, Turn
from omnistage.entrypoints.openai.video_chat.frames import FrameBuffer, make_frame
from omnistage.entrypoints.openai.video_chat.protocol import (
    EVENTS,
    AudioChunk,
    ClientEvent,
    SessionConfig,
    VideoFrame,
    VideoQuery,
)
from omnistage.entrypoints.openai.ws_session import EventSession, SessionLimit
from omnistage.media.image import decode_base64_payload

logger = logging.getLogger(__name__)
AUDIO_FORMAT = "audio/pcm"


@dataclass(frozen=True)
class Settings:
    """The session as session.config left it (what session.updated shows)."""

    model: str
    modalities: tuple[str, ...] = ("text", "audio")
    num_frames: int = 4
    max_frames: int = 50
    system_prompt: str = ""
    use_audio_in_video: bool = True
    sampling_params_list: list[dict[str, Any]] = field(default_factory=list)
    enable_frame_filter: bool = True
    frame_filter_threshold: float = 0.95
    voice: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "modalities": list(self.modalities), "num_frames": self.num_frames,
                "max_frames": self.max_frames, "system_prompt": self.system_prompt,
                "use_audio_in_video": self.use_audio_in_video, "sampling_params_list": self.sampling_params_list,
                "enable_frame_filter": self.enable_frame_filter,
                "frame_filter_threshold": self.frame_filter_threshold, "voice": self.voice}


class VideoChatSession(EventSession):
    def __init__(self, websocket: WebSocket, gateway: EngineGateway, settings: ServerSettings, media: InputMedia,
                 speaks: bool):
        super().__init__(websocket, gateway, settings)
        self.media = media
        self.speaks = speaks
        """The model answers in audio too (an omni model with a talker)."""
        self.settings = Settings(model=settings.served_model_name,
                                 modalities=("text", "audio") if speaks else ("text",))
        self.entry_stage = gateway.engine.spec.entry_stages[0].name
        self.context = Context()
        self.frames = FrameBuffer()
        self.audio: list[np.ndarray] = []  # the stream's audio since the last query, at 24 kHz
        self.answer: Answer | None = None
        self.warmer = PrefixWarmer(gateway, self.entry_stage, settings.video_chat_prefill, self._prefilled)

    async def _cleanup(self) -> None:
        if self.answer is not None:
            self.answer.cancel()
            await asyncio.gather(self.answer.task, return_exceptions=True)
        await self.warmer.close()

    def _is_answering(self) -> bool:
        return self.answer is not None and not self.answer.task.done()

    async def _session(self) -> None:
        try:
            await self._send({"type": "session.created", "session": {"id": self.id, **self.settings.as_json()}})
            while True:
                message = await self._receive()
                try:
                    await self._handle(_parse(message))
                except APIError as e:
                    await self._error(e, _event_id(message))
                except (WebSocketDisconnect, RuntimeError, SessionLimit):
                    raise
                except Exception:  # noqa: BLE001 - a bug fails this event, never the session
                    logger.exception("video chat session %s: event failed", self.id)
                    await self._error(APIError(500, "the event failed inside the server", code="internal_error"),
                                      _event_id(message))
        except SessionLimit as end:
            await self._end(end)
        except (WebSocketDisconnect, RuntimeError):  # the client went away (RuntimeError: sent to a closed socket)
            pass

    async def _handle(self, event: ClientEvent) -> None:
        if isinstance(event, SessionConfig):
            await self._configure(event)
        elif isinstance(event, VideoFrame):
            await self._add_frame(event)
        elif isinstance(event, AudioChunk):
            self._add_audio(event)
        elif isinstance(event, VideoQuery):
            await self._query(event)

    # --- client events -------------------------------------------------------------------

    async def _configure(self, event: SessionConfig) -> None:
        if event.model is not None and event.model != self.settings.model:
            raise bad_request(f"model: this server serves {self.settings.model!r}", param="model")
        given = {k: getattr(event, k) for k in event.model_fields_set if k not in ("type", "event_id", "model")}
        if given.get("modalities") is not None:
            modalities = tuple(dict.fromkeys(given["modalities"]))
            if "text" not in modalities:
                raise bad_request("modalities: answers are text, or text and audio: ['text'] or ['text', 'audio']",
                                  param="modalities")
            if "audio" in modalities and not self.speaks:
                raise bad_request(f"modalities: model {self.settings.model!r} does not answer in audio",
                                  param="modalities")
            given["modalities"] = modalities
        if given.get("sampling_params_list") is not None:
            stage_params(self.gateway.engine.spec, given["sampling_params_list"])  # an error event now, not later
        if "system_prompt" in given:
            given["system_prompt"] = given["system_prompt"] or ""
        updated = replace(self.settings, **{k: v for k, v in given.items() if v is not None or k == "voice"})
        if updated.max_frames < len(self.frames):
            raise bad_request(f"max_frames: {len(self.frames)} frames are buffered already", param="max_frames")
        self.settings = updated
        self.context.system_prompt = updated.system_prompt
        await self._send({"type": "session.updated", "session": {"id": self.id, **updated.as_json()}})
        self._warm()

    async def _add_frame(self, event: VideoFrame) -> None:
        frame_id = event.frame_id or f"frame_{self.frames.num_received}"
        self.frames.num_received += 1
        if len(self.frames) >= self.settings.max_frames:
            raise bad_request(f"video.frame: the frame buffer holds max_frames={self.settings.max_frames} frames "
                              "no query has taken; the frame is dropped (send video.query, or raise max_frames)",
                              param="max_frames", code="frame_buffer_full")
        try:
            data = decode_base64_payload(event.image, "image")
        except ValueError as e:
            raise bad_request(str(e), param="image", code="invalid_image") from None
        image = await self.media.image(data, "image")  # 400 image_too_large / invalid_image, named "image"
        frame = await asyncio.to_thread(make_frame, image, frame_id, event.pts_ms)
        s = self.settings
        if self.frames.is_repeat(frame, s.frame_filter_threshold if s.enable_frame_filter else None):
            return
        self.frames.add(frame)
        if len(self.frames) <= s.num_frames:  # the next query takes it: warm its prompt
            self._warm()

    def _add_audio(self, event: AudioChunk) -> None:
        if not self.settings.use_audio_in_video:
            raise bad_request("audio.chunk: the session has use_audio_in_video=false", param="use_audio_in_video")
        audio = _decode_audio(event.audio, "audio")
        buffered = sum(len(a) for a in self.audio) + len(audio)
        if buffered > self.limits.realtime_max_buffer_s * audio_format.RATES[AUDIO_FORMAT]:
            raise bad_request(f"audio: the session holds more than {self.limits.realtime_max_buffer_s:g} s of audio "
                              "no query has taken; the chunk is dropped", param="audio", code="audio_buffer_full")
        self.audio.append(audio)

    async def _query(self, event: VideoQuery) -> None:
        if not (event.text or event.audio):
            raise bad_request("video.query needs a question: text, audio or both", param="text")
        if self.answer is not None and not self.answer.task.done():
            raise bad_request(f"a response is running ({self.answer.id!r}); wait for its response.done",
                              code="conversation_already_has_active_response")
        rate = audio_format.RATES[AUDIO_FORMAT]
        question_audio = [(_decode_audio(event.audio, "audio"), rate)] if event.audio else []
        stream_audio = [(np.concatenate(self.audio), rate)] if self.audio else []
        frames = self.frames.take(self.settings.num_frames)
        self.audio = []
        turn = Turn(frames, stream_audio + question_audio, event.text or "")
        pts = [f.pts_ms for f in frames if f.pts_ms is not None]
        await self._send({"type": "video.frames.consumed", "frame_ids": [f.id for f in frames],
                          "frames": len(frames), "latest_pts_ms": max(pts) if pts else None})
        self.answer = Answer(self.gateway, self.settings, self.context, turn, self.warmer, self._send, self._warm)
        self.answer.start()

    def _warm(self) -> None:
        """Prefill the prompt the next query starts with, unless an answer is being written (it
        extends the conversation: the warm-up follows it)."""
        if self.answer is not None and not self.answer.task.done():
            return
        frames = self.frames.peek(self.settings.num_frames)
        self.warmer.warm(self.context.messages(Turn(frames)), "audio" in self.settings.modalities,
                         [f.id for f in frames])

    async def _prefilled(self, frame_ids: list[str]) -> None:
        await self._send({"type": "video.frames.prefilled", "frame_ids": frame_ids, "frames": len(frame_ids)})

    # --- server events --------------------------------------------------------------------

def _parse(message: dict[str, Any]) -> ClientEvent:
    """A client event, or a 400 naming what is wrong with it."""
    return typed_event(event_object(message), EVENTS)


def _event_id(message: dict[str, Any]) -> str | None:
    try:
        raw = json.loads(message.get("text") or "null")
    except ValueError:
        return None
    return raw.get("event_id") if isinstance(raw, dict) and isinstance(raw.get("event_id"), str) else None


def _decode_audio(data: str, param: str) -> np.ndarray:
    try:
        return audio_format.decode(base64.b64decode(data, validate=True), AUDIO_FORMAT)
    except (binascii.Error, ValueError) as e:
        raise bad_request(f"{param}: not base64 PCM16 audio at 24 kHz ({e})", param=param) from None
