"""The FastAPI application: app state, route groups, middleware and OpenAI-style errors.

`create_app` takes everything it needs as arguments (no module globals), so tests can
build an app around any engine client. What a request can reach:

    /                       the web playground (playground/; unless --no-playground)
    /health                 200, or 503 when the engine is unhealthy
    /metrics                Prometheus text: HTTP, queue and (from the engine) stage metrics
    /files/{name}           images and videos handed out by URL (the name is the secret)
    /v1/models              the served model: its routes, stages, max_model_len, input and output modalities,
                            and each stage's request defaults
    /v1/images/...          images/       (diffusion models with image output)
    /v1/videos...           videos/       (diffusion models with video output)
    /v1/chat/completions    chat/         (text, omni and image models; /batch: many conversations, one answer)
    /v1/responses...        responses/    (text, omni and image models, over the chat path; stored
                                           responses: GET / DELETE, cancel, input_items)
    /v1/completions         completions/  (text and omni models: the text of a raw prompt)
    /v1/audio/speech        audio/        (models with audio output; also /v1/audio/voices
                                           and the WebSocket /v1/audio/speech/stream)
    /v1/audio/generate      audio/        (diffusion models with audio output: text -> sound)
    /v1/audio/transcriptions audio/       (omni models: speech -> text, by the thinker; and
                                           /v1/audio/translations: speech -> English text)
    /v1/realtime            realtime/     (WebSocket, OpenAI's Realtime protocol: omni models, voice in and out)
    /v1/realtime/video      realtime_video/ (WebSocket: video models, the video streamed as fragmented MP4)
    /v1/video/chat/stream   video_chat/   (WebSocket: live video in, answers out: omni models)

Every /v1 route needs the API key when one is set, and so do /openapi.json, /docs and
/redoc unless `public_docs`, and /metrics with `protect_metrics`. The app's lifespan shuts down, in
order: video jobs (their engine requests are aborted), the engine, the served files.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from omnistage.entrypoints.openai.audio.api_router import attach_router as attach_audio
from omnistage.entrypoints.openai.audio.generate import AudioGenerateServing
from omnistage.entrypoints.openai.audio.serving import SpeechServing
from omnistage.entrypoints.openai.audio.transcriptions import TranscriptionServing
from omnistage.entrypoints.openai.audio.voices import VoiceStore
from omnistage.entrypoints.openai.capabilities import Capabilities, model_facts
from omnistage.entrypoints.openai.defaults import effective_defaults
from omnistage.entrypoints.openai.chat.api_router import attach_router as attach_chat
from omnistage.entrypoints.openai.chat.serving import ChatServing
from omnistage.entrypoints.openai.completions.api_router import attach_router as attach_completions
from omnistage.entrypoints.openai.completions.serving import CompletionServing
from omnistage.entrypoints.openai.engine_client import EngineGateway, maybe_await
from omnistage.entrypoints.openai.errors import APIError, install_error_handlers, openai_error
from omnistage.entrypoints.openai.files import MEDIA_TYPES, FileStore
from omnistage.entrypoints.openai.images.api_router import attach_router as attach_images
from omnistage.entrypoints.openai.images.serving import ImageServing
from omnistage.entrypoints.openai.media_inputs import InputMedia
from omnistage.entrypoints.openai.metrics import ServerMetrics
from omnistage.entrypoints.openai.middleware import (
    AuthMiddleware,
    BodySizeLimitMiddleware,
    ErrorBoundaryMiddleware,
    MetricsMiddleware,
)
from omnistage.entrypoints.openai.openapi import install_openapi
from omnistage.entrypoints.openai.playground import attach_playground
from omnistage.entrypoints.openai.realtime.api_router import attach_router as attach_realtime
from omnistage.entrypoints.openai.realtime.serving import RealtimeServing
from omnistage.entrypoints.openai.realtime_video.api_router import attach_router as attach_realtime_video
from omnistage.entrypoints.openai.video_chat.api_router import attach_router as attach_video_chat
from omnistage.entrypoints.openai.video_chat.serving import VideoChatServing
from omnistage.entrypoints.openai.responses.api_router import attach_router as attach_responses
from omnistage.entrypoints.openai.responses.serving import ResponsesServing
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.sleep.api_router import attach_router as attach_sleep
from omnistage.entrypoints.openai.sleep.serving import SleepServing
from omnistage.entrypoints.openai.weights.api_router import attach_router as attach_weights
from omnistage.entrypoints.openai.lora.api_router import attach_router as attach_lora
from omnistage.entrypoints.openai.lora.serving import LoraServing
from omnistage.entrypoints.openai.weights.serving import WeightsServing
from omnistage.entrypoints.openai.videos.api_router import attach_router as attach_videos
from omnistage.entrypoints.openai.videos.serving import VideoServing

__all__ = ["EngineFacts", "ServerSettings", "create_app", "openai_error"]


@dataclasses.dataclass(frozen=True)
class EngineFacts:
    """What the app reads from the engine's declarations once, at build: its routes and each
    stage's request defaults. Working them out imports the model registries (and so torch),
    which is why an API server process gets them made by the engine's process."""

    capabilities: Capabilities
    defaults: dict[str, dict[str, Any]]

    @classmethod
    def of(cls, settings: ServerSettings, engine: Any) -> EngineFacts:
        if engine is None:
            return cls(Capabilities(settings.served_model_name, frozenset()), {})
        return cls(Capabilities.from_spec(settings.served_model_name, engine.spec), effective_defaults(engine))


def create_app(settings: ServerSettings, engine: Any = None, registry: CollectorRegistry | None = None,
               facts: EngineFacts | None = None) -> FastAPI:
    """Build the app around `engine` (an AsyncOmni or anything with its surface; None
    serves only metadata). `registry` is the Prometheus registry the engine exports into;
    `facts` default to `EngineFacts.of(settings, engine)`."""
    metrics = ServerMetrics(registry)
    files = FileStore(settings.file_ttl_s, settings.files_dir)
    media = InputMedia(settings)
    facts = facts or EngineFacts.of(settings, engine)
    capabilities = facts.capabilities
    gateway = EngineGateway(engine, settings.max_queued_requests, metrics)
    video_serving = VideoServing(gateway, capabilities, settings, files, media)
    chat_serving = ChatServing(gateway, capabilities, settings)
    responses_serving = ResponsesServing(chat_serving, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await video_serving.shutdown()
            await responses_serving.shutdown()
            if engine is not None:
                await maybe_await(engine.shutdown())
            files.close()
            media.close()

    app = FastAPI(title="omnistage", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.files = files
    app.state.capabilities = capabilities
    app.state.defaults = facts.defaults
    app.state.model_facts = None
    # What /v1/models lists beside the routes (the playground shows it).
    app.state.stages = [{"id": st.id, "name": st.name, "kind": st.kind, "output": st.output}
                        for st in (engine.spec.stages if engine is not None else ())]
    app.state.gateway = gateway
    app.state.media = media
    app.state.image_serving = ImageServing(gateway, capabilities, settings, files)
    app.state.video_serving = video_serving
    app.state.chat_serving = chat_serving
    app.state.responses_serving = responses_serving
    app.state.completion_serving = CompletionServing(gateway, capabilities, settings)
    app.state.voice_store = VoiceStore.from_spec(engine.spec if engine is not None else None)
    app.state.speech_serving = SpeechServing(gateway, capabilities, settings, app.state.voice_store)
    app.state.audio_generate_serving = AudioGenerateServing(gateway, capabilities, settings)
    app.state.sleep_serving = SleepServing(engine)
    app.state.weights_serving = WeightsServing(engine)
    app.state.lora_serving = LoraServing(engine)
    app.state.transcription_serving = TranscriptionServing(gateway, capabilities, settings)
    app.state.realtime_serving = RealtimeServing(gateway, capabilities, settings)
    app.state.video_chat_serving = VideoChatServing(gateway, capabilities, settings, media)

    install_error_handlers(app)
    # Added last = runs first: metrics see every answer, the error boundary makes each one
    # OpenAI JSON, auth and size run before routing.
    app.add_middleware(BodySizeLimitMiddleware)
    app.add_middleware(AuthMiddleware)
    app.add_middleware(ErrorBoundaryMiddleware)
    app.add_middleware(MetricsMiddleware)

    _attach_system_routes(app)
    for attach in (attach_images, attach_videos, attach_chat, attach_responses, attach_completions, attach_audio,
                   attach_sleep, attach_weights, attach_lora, attach_realtime, attach_realtime_video,
                   attach_video_chat):
        attach(app)
    if settings.playground:
        attach_playground(app)
    install_openapi(app)  # every status each route can answer, and the streamed content types
    return app


def _attach_system_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        engine = request.app.state.engine
        healthy = engine is None or bool(await maybe_await(engine.check_health()))
        return JSONResponse(status_code=200 if healthy else 503, content={"status": "ok" if healthy else "unhealthy"})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        sync = getattr(request.app.state.engine, "sync_metrics", None)
        if sync is not None:  # an engine in another process (api_servers.py): fetch its metrics first
            await sync()
        return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict:
        state = request.app.state
        s: ServerSettings = state.settings
        if state.model_facts is None:  # read from the checkpoint once
            state.model_facts = await asyncio.to_thread(model_facts, s.model_path, state.engine, state.capabilities)
        return {"object": "list", "data": [
            {"id": s.served_model_name, "object": "model", "created": s.created, "owned_by": "omnistage",
             "root": s.model_path, "routes": state.capabilities.routes, "stages": state.stages,
             "defaults": state.defaults, **state.model_facts}]}

    @app.get("/files/{name}")
    async def get_file(name: str, request: Request) -> FileResponse:
        path = request.app.state.files.path(name)
        if path is None:
            raise APIError(404, "no such file (file URLs expire)", code="file_not_found")
        return FileResponse(path, media_type=MEDIA_TYPES.get(path.suffix, "application/octet-stream"))
