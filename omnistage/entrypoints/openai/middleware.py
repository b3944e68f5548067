"""ASGI middleware that runs before any route: errors, metrics, API-key auth, body-size limit.

They read the app's settings from `scope["app"].state` on every request, so they hold
no state of their own and tests can build apps with any settings.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import time
import uuid
from typing import Any

from starlette.exceptions import HTTPException

from omnistage.entrypoints.openai.errors import APIError, shutting_down
from omnistage.entrypoints.openai.media_inputs import CLIENT

Scope = dict[str, Any]

logger = logging.getLogger(__name__)

_CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def _settings(scope: Scope) -> Any:
    return scope["app"].state.settings


async def _send_error(send: Any, error: APIError) -> None:
    response = error.response()
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


def request_id(scope: Scope) -> str | None:
    """The id `ErrorBoundaryMiddleware` gave this request (echoed as `x-request-id`)."""
    return scope.get("state", {}).get("request_id")


class ErrorBoundaryMiddleware:
    """The outermost layer: whatever happens inside, the client gets OpenAI's JSON body.

    - It gives every request an id (the client's `x-request-id` when it is sane, else a
      new one), sends it back as `x-request-id` and logs every 5xx answer with it.
    - An exception nothing handled (in a route or in another middleware) becomes a 500
      in OpenAI's body, instead of Starlette's plain-text "Internal Server Error".
    - A request cancelled before it answered (uvicorn cancels what is still running when
      the graceful shutdown timeout ends) gets a 503 with `Retry-After`.
    """

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _CLIENT_REQUEST_ID.match(given) else f"req_{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = rid
        client = scope.get("client")
        CLIENT.set(client[0] if client else "")  # whose share of the media pools this request uses
        started = False
        status = 0
        logged = False

        async def send_wrapper(message: dict) -> None:
            nonlocal started, status, logged
            if message["type"] == "http.response.start":
                started, status = True, message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            elif message["type"] == "http.response.body" and status >= 500 and not logged:
                logged = True
                logger.error("%s %s answered %d (request %s): %s", scope["method"], scope["path"], status, rid,
                             _error_message(message.get("body", b"")))
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except asyncio.CancelledError:
            if started:
                raise
            logger.error("%s %s cancelled before it answered, the server is stopping (request %s)",
                         scope["method"], scope["path"], rid)
            await _send_error(send_wrapper, shutting_down())
        except Exception as e:
            logger.exception("%s %s failed (request %s)", scope["method"], scope["path"], rid)
            if not started:
                logged = True  # just logged with its traceback
                await _send_error(send_wrapper, APIError(500, f"internal server error: {type(e).__name__} "
                                                              f"(request {rid})", type="server_error"))


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")


class MetricsMiddleware:
    """Counts every HTTP answer by route template and status, and times it to its last byte."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            # Route templates keep the label set small (no video ids); unrouted paths share one label.
            label = getattr(route, "path", None) or "(unmatched)"
            scope["app"].state.metrics.observe_http(label, scope["method"], status, time.perf_counter() - start)


_DOCS_PATHS = ("/openapi.json", "/docs", "/redoc")


def needs_key(path: str, settings: Any) -> bool:
    """Which paths the API key guards: every /v1 route; the API docs unless `public_docs`;
    /metrics with `protect_metrics`. /health and /files/... stay open (probes; URLs are secrets)."""
    if path.startswith("/v1/"):
        return True
    if path in _DOCS_PATHS or path.startswith("/docs/"):
        return not settings.public_docs
    return path == "/metrics" and settings.protect_metrics


class AuthMiddleware:
    """With an API key set, the paths `needs_key` names need `Authorization: Bearer <key>` (401 otherwise)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        settings = _settings(scope) if scope["type"] == "http" else None
        key = settings.api_key if settings is not None else None
        if key and scope["method"] != "OPTIONS" and needs_key(scope["path"], settings):
            given = [value for name, value in scope["headers"] if name == b"authorization"]
            if len(given) > 1:  # proxies disagree on which one counts: refuse rather than pick
                return await _send_error(send, APIError(400, "send one Authorization header, got "
                                                             f"{len(given)}", param="authorization",
                                                        code="invalid_api_key"))
            scheme, _, token = (given[0] if given else b"").decode("latin-1").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), key.encode()):
                message = ("missing API key: send 'Authorization: Bearer <key>'" if not token
                           else "invalid API key")
                return await _send_error(send, APIError(401, message, code="invalid_api_key",
                                                        headers={"www-authenticate": "Bearer"}))
        await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    """Answers 413 for bodies over `max_upload_bytes`: from Content-Length before reading,
    or while reading a chunked body (raised as an HTTPException so that FastAPI's body
    parsing passes it through to the error handler)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = _settings(scope).max_upload_bytes
        message = f"the request body is larger than the server's limit of {limit} bytes"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await _send_error(send, APIError(413, message, code="request_too_large"))
        received = 0

        async def receive_wrapper() -> dict:
            nonlocal received
            event = await receive()
            if event["type"] == "http.request":
                received += len(event.get("body", b""))
                if received > limit:
                    raise HTTPException(413, message)
            return event

        await self.app(scope, receive_wrapper, send)


class ServerIdMiddleware:
    """Names the API server process that answered (`x-omnistage-api-server: <pid>`), where several
    share one port (`--api-server-count`): a client or a test can tell which one served it."""

    def __init__(self, app: Any):
        self.app = app
        self.header = (b"x-omnistage-api-server", str(os.getpid()).encode())

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_id)
