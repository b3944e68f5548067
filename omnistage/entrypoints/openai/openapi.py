"""The OpenAPI document as the server really answers, for schema-driven clients and fuzzers.

FastAPI documents a 422 for every route with a body and nothing else. The server never
answers 422 (validation errors are OpenAI's 400), and every route can answer the errors
of the middleware and the engine gateway. So the document is built once by FastAPI, then:
- 422 is dropped; each route lists the statuses it can answer, with OpenAI's error body;
- streaming routes list their other 200 content types (SSE, audio, video);
- multipart routes get their form body; request fields get descriptions and examples, and
  each route its extension fields (`x-extra-body`), from openapi_fields.py.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from omnistage.entrypoints.openai.openapi_fields import add_form_bodies, describe, describe_extensions

ERROR_SCHEMA: dict[str, Any] = {
    "title": "ErrorResponse", "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}

_WHY = {
    400: "Invalid request: the body names the field (`error.param`)",
    401: "Missing or invalid API key (when the server has one)",
    404: "Unknown model, route, file, video or voice",
    409: "A voice of that name exists, the video job has not completed, or a LoRA adapter is in use",
    413: "Request body over the server's limit",
    415: "Wrong Content-Type",
    429: "Too many requests queued; retry after `retry-after` seconds",
    500: "The engine failed the request",
    503: "No engine loaded, or the engine is unhealthy",
}

# Statuses by kind of route; /health and /metrics need no key, /files take no body.
_ENGINE_POST = (400, 401, 404, 413, 415, 429, 500, 503)
_READ = (401, 404, 500)
_BY_ROUTE: dict[tuple[str, str], tuple[int, ...]] = {
    ("get", "/health"): (503,),
    ("get", "/metrics"): (500,),
    ("get", "/files/{name}"): (404, 500),
    ("get", "/v1/models"): (401, 500),
    ("post", "/v1/audio/voices"): (400, 401, 409, 413, 415, 500),
    ("delete", "/v1/audio/voices/{name}"): (400, 401, 404, 500),
    ("get", "/v1/audio/voices"): (400, 401, 500),
    ("delete", "/v1/videos/{video_id}"): (401, 404, 500),
    ("get", "/v1/videos"): (400, 401, 500),  # `after` naming no job
    ("get", "/v1/videos/{video_id}/content"): (401, 404, 409, 500),  # 409: not completed yet
    ("delete", "/v1/responses/{response_id}"): (401, 404, 500),
    ("post", "/v1/responses/{response_id}/cancel"): (400, 401, 404, 500),  # 400: not a running background one
    ("get", "/v1/responses/{response_id}/input_items"): (400, 401, 404, 500),  # `after` naming no item
    ("get", "/v1/lora_adapters"): (401, 500),
    ("post", "/v1/lora_adapters"): (400, 401, 409, 413, 415, 500),  # 409: no free slot, or max_loras: 0
    ("delete", "/v1/lora_adapters/{name}"): (400, 401, 409, 500),  # 409: in use
}

_STREAMED_200: dict[tuple[str, str], tuple[str, ...]] = {
    ("post", "/v1/chat/completions"): ("text/event-stream",),
    ("post", "/v1/completions"): ("text/event-stream",),
    ("post", "/v1/responses"): ("text/event-stream",),
    ("post", "/v1/audio/speech"): ("audio/mpeg", "audio/wav", "audio/pcm", "audio/flac", "audio/ogg", "audio/aac",
                                   "text/event-stream"),
    ("post", "/v1/audio/transcriptions"): ("text/plain", "text/vtt", "text/event-stream"),
    ("post", "/v1/audio/translations"): ("text/plain", "text/vtt"),
    ("post", "/v1/audio/generate"): ("audio/wav", "audio/mpeg", "audio/pcm", "audio/flac", "audio/ogg", "audio/aac"),
    ("post", "/v1/videos/sync"): ("video/mp4",),
    ("get", "/v1/videos/{video_id}/content"): ("video/mp4",),
}


def install_openapi(app: FastAPI) -> None:
    """Replace `app.openapi` (FastAPI's documented hook) with the corrected document."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {})["ErrorResponse"] = ERROR_SCHEMA
            add_form_bodies(schema)
            describe(schema["components"]["schemas"])
            for path, methods in schema.get("paths", {}).items():
                for method, operation in methods.items():
                    _fix_operation(method, path, operation)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def route_statuses(method: str, path: str) -> tuple[int, ...]:
    """The error statuses a route can answer."""
    key = (method, path)
    if key in _BY_ROUTE:
        return _BY_ROUTE[key]
    return _ENGINE_POST if method == "post" else _READ


def _fix_operation(method: str, path: str, operation: dict[str, Any]) -> None:
    describe_extensions(method, path, operation)
    responses = operation.setdefault("responses", {})
    responses.pop("422", None)
    ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for status in route_statuses(method, path):
        responses[str(status)] = {"description": _WHY[status], "content": {"application/json": {"schema": ref}}}
    streamed = _STREAMED_200.get((method, path))
    if streamed:
        ok = responses.setdefault("200", {"description": "Successful Response"})
        content = ok.setdefault("content", {})
        for media_type in streamed:
            content.setdefault(media_type, {"schema": {"type": "string", "format": "binary"}}
                               if not media_type.startswith("text/") else {"schema": {"type": "string"}})
