"""OpenAI's error body, and the one place that turns every failure into it.

Every error the server answers has the shape
`{"error": {"message": str, "type": str, "param": str | None, "code": str | None}}`:
request validation (pydantic, ours), unknown routes and methods (Starlette), engine
rejections (`ValueError` before queueing), stages that are down or restarting (503 with
`Retry-After`) and unexpected failures (500, no traceback; see also `middleware.py`'s
error boundary, which catches what these handlers do not).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from omnistage.core.errors import RequestErrors

logger = logging.getLogger(__name__)

_TYPES_BY_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """An error answered with `status` and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES_BY_STATUS.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(status_code=self.status, content=self.body(), headers=self.headers)


class EngineError(APIError):
    """The engine failed a request it had accepted (500, with the engine's reason)."""

    def __init__(self, message: str):
        super().__init__(500, f"the engine failed the request: {message}", type="server_error", code="engine_error")


class RequestBodyError(StarletteHTTPException):
    """An `APIError` raised while FastAPI parses a body: FastAPI passes HTTPExceptions
    through unchanged (anything else becomes a bare "error parsing the body")."""

    def __init__(self, error: APIError):
        super().__init__(error.status, error.message)
        self.error = error


RETRY_AFTER_S = 5
"""What `Retry-After` tells a client when a stage is down, restarting or stopping."""


def unavailable(message: str, code: str = "engine_unavailable") -> APIError:
    """503 with `Retry-After`: the engine or one of its stages cannot serve now, but may soon."""
    return APIError(503, message, code=code, headers={"retry-after": str(RETRY_AFTER_S)})


def shutting_down() -> APIError:
    """What a request still running when the server stops is answered (a 503, or a stream's last event)."""
    return unavailable("the server is shutting down; retry on another replica or later", code="server_shutting_down")


def openai_error(status: int, message: str, type_: str | None = None, param: str | None = None,
                 code: str | None = None) -> JSONResponse:
    """OpenAI's error body as a response."""
    return APIError(status, message, param=param, code=code, type=type_).response()


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def from_validation_errors(errors: list[dict[str, Any]]) -> APIError:
    """A 400 naming the first failing field, from pydantic's (or FastAPI's) error list."""
    if not errors:
        return bad_request("invalid request")
    first = errors[0]
    loc = list(first.get("loc", ()))
    if loc and loc[0] in ("body", "query", "path", "form", "header"):  # where it sits, not a field (a body may
        loc = loc[1:]                                                     # have a field named "path")
    param = _param_path(loc)
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        message = f"unknown field {param!r}"
    elif kind == "json_invalid":
        param = None
        message = f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})"
    elif kind in ("model_attributes_type", "dict_type") and not loc:
        message = "the request body must be a JSON object"
    else:
        message = f"{param or 'request'}: {first.get('msg', 'invalid value')}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return bad_request(message, param=param, code="invalid_value" if kind != "extra_forbidden" else "unknown_field")


def _param_path(loc: list) -> str | None:
    """("messages", 0, "role") -> "messages[0].role"; pydantic's union-branch names are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or "(" in str(part):  # e.g. "list[...]", "function-after[...]"
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or None


def from_value_error(e: ValueError) -> APIError:
    """An engine or params rejection as a 400; a `RequestError` names its field (`param`)."""
    if isinstance(e, ValidationError):
        return from_validation_errors(e.errors())
    if isinstance(e, RequestErrors):  # every problem in the message, the first one's field as `param`
        return bad_request(str(e), param=e.errors[0].param)
    return bad_request(str(e) or "invalid request", param=getattr(e, "param", None))


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return from_validation_errors(list(exc.errors())).response()


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if isinstance(exc, RequestBodyError):
        return exc.error.response()
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    code = "request_too_large" if exc.status_code == 413 else None
    return APIError(exc.status_code, message, code=code, headers=getattr(exc, "headers", None)).response()


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return APIError(500, f"internal server error: {type(exc).__name__}", type="server_error").response()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
