"""The FastAPI application: app state, route groups, and OpenAI-style errors.

`create_app` takes everything it needs as arguments (no module globals), so tests can
build an app around any engine client. Route groups live in sibling folders and mount
themselves with `attach_router(app)`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


@dataclass
class ServerSettings:
    served_model_name: str
    model_path: str
    created: int = field(default_factory=lambda: int(time.time()))


def openai_error(status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> JSONResponse:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
    return JSONResponse(status_code=status,
                        content={"error": {"message": message, "type": type_, "param": param, "code": code}})


def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "form")]
    param = ".".join(loc) or None
    return openai_error(400, f"{param or 'request'}: {first.get('msg', 'invalid request')}", param=param)


def create_app(settings: ServerSettings, engine: Any = None) -> FastAPI:
    """Build the app. `engine` is the AsyncOmni client (None while only metadata is served)."""
    app = FastAPI(title="omnistage", version="0.1.0")
    app.state.settings = settings
    app.state.engine = engine
    app.add_exception_handler(RequestValidationError, _validation_error)

    @app.get("/health")
    async def health() -> JSONResponse:
        engine = app.state.engine
        healthy = engine is None or await _maybe_await(engine.check_health())
        return JSONResponse(status_code=200 if healthy else 503, content={"status": "ok" if healthy else "unhealthy"})

    @app.get("/v1/models")
    async def list_models() -> dict:
        s = app.state.settings
        return {"object": "list", "data": [
            {"id": s.served_model_name, "object": "model", "created": s.created, "owned_by": "omnistage",
             "root": s.model_path}]}

    return app


async def _maybe_await(value: Any) -> Any:
    if hasattr(value, "__await__"):
        return await value
    return value
