"""Routes of the audio group. Handlers come from `app.state`: `speech_serving` (speech, its
batch and its WebSocket stream), `voice_store` (voices), `audio_generate_serving` (text -> sound) and
`transcription_serving` (speech -> text)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request, WebSocket
from fastapi.responses import Response, StreamingResponse

from omnistage.entrypoints.openai.audio.generate import AudioGenerateServing
from omnistage.entrypoints.openai.audio.protocol import (
    AudioGenerateRequest,
    SpeechBatchRequest,
    SpeechBatchResponse,
    SpeechRequest,
    TranscriptionRequest,
    TranslationRequest,
    VoiceInfo,
    VoiceList,
)
from omnistage.entrypoints.openai.audio.serving import SpeechServing
from omnistage.entrypoints.openai.audio.stream import SpeechStreamSession
from omnistage.entrypoints.openai.audio.transcriptions import TranscriptionServing
from omnistage.entrypoints.openai.audio.voices import VoiceStore
from omnistage.entrypoints.openai.common import check_websocket_key, read_form, require_json, validate
from omnistage.entrypoints.openai.errors import bad_request
from omnistage.entrypoints.openai.json_body import JSONBodyRoute

router = APIRouter(route_class=JSONBodyRoute)


def serving(request: Request) -> SpeechServing:
    return request.app.state.speech_serving


def voice_store(request: Request) -> VoiceStore:
    request.app.state.capabilities.require("audio.speech")
    return request.app.state.voice_store


@router.post("/v1/audio/speech", dependencies=[Depends(require_json)], response_model=None)
async def create_speech(body: SpeechRequest, handler: SpeechServing = Depends(serving)) -> Response:
    answer = await handler.create(body)
    headers = {"x-sample-rate": str(answer.sample_rate)}
    if isinstance(answer.body, bytes):
        return Response(answer.body, media_type=answer.media_type, headers=headers)
    return StreamingResponse(answer.body, media_type=answer.media_type, headers=headers)


@router.post("/v1/audio/speech/batch", dependencies=[Depends(require_json)])
async def create_speech_batch(body: SpeechBatchRequest, request: Request,
                              handler: SpeechServing = Depends(serving)) -> SpeechBatchResponse:
    return await handler.create_batch(body, request)


def generate_serving(request: Request) -> AudioGenerateServing:
    return request.app.state.audio_generate_serving


@router.post("/v1/audio/generate", dependencies=[Depends(require_json)], response_model=None)
async def generate_audio(body: AudioGenerateRequest, request: Request,
                         handler: AudioGenerateServing = Depends(generate_serving)) -> Response:
    answer = await handler.create(body, request)
    headers = {"x-sample-rate": str(answer.sample_rate), "x-audio-channels": str(answer.num_channels)}
    return Response(answer.body, media_type=answer.media_type, headers=headers)


def transcription_serving(request: Request) -> TranscriptionServing:
    return request.app.state.transcription_serving


@router.post("/v1/audio/transcriptions", response_model=None)
async def create_transcription(request: Request,
                               handler: TranscriptionServing = Depends(transcription_serving)) -> Response:
    return await _speech_to_text(request, handler, TranscriptionRequest)


@router.post("/v1/audio/translations", response_model=None)
async def create_translation(request: Request,
                             handler: TranscriptionServing = Depends(transcription_serving)) -> Response:
    return await _speech_to_text(request, handler, TranslationRequest)


async def _speech_to_text(request: Request, handler: TranscriptionServing, model: type) -> Response:
    form = await read_form(request, allow_urlencoded=False, file_fields=("file",))
    uploads = form.files.get("file", [])
    if len(uploads) != 1:
        raise bad_request("file: send one audio file", param="file")
    answer = await handler.create(validate(model, form.fields), uploads[0], request)
    if isinstance(answer.body, str):
        return Response(answer.body, media_type=answer.media_type)
    return StreamingResponse(answer.body, media_type=answer.media_type)


@router.post("/v1/audio/voices")
async def register_voice(request: Request, voices: VoiceStore = Depends(voice_store)) -> VoiceInfo:
    return await voices.register(request)


@router.get("/v1/audio/voices")
async def list_voices(voices: VoiceStore = Depends(voice_store)) -> VoiceList:
    return voices.list()


@router.delete("/v1/audio/voices/{name}")
async def delete_voice(name: str, voices: VoiceStore = Depends(voice_store)) -> dict:
    return voices.delete(name)


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(websocket: WebSocket) -> None:
    state = websocket.app.state
    if not await check_websocket_key(websocket, state.settings):
        return
    if not state.capabilities.serves("audio.speech"):
        await websocket.accept()
        error = bad_request(f"model {state.capabilities.model!r} does not make speech", code="unsupported_route")
        await websocket.send_json({"type": "error", "message": error.message, "param": None, "code": error.code})
        await websocket.close(code=1008)
        return
    await SpeechStreamSession(websocket, state.speech_serving).run()


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
