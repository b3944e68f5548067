"""Edge checks shared by the route groups: model name, sizes, forms, extension fields.

Each check raises `APIError` (400/404/415) naming the field, so route code reads as a
list of checks followed by one engine call.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.websockets import WebSocket

from omnistage.core.lora import LoraRequest
from omnistage.entrypoints.openai import json_body
from omnistage.entrypoints.openai.errors import APIError, bad_request, from_validation_errors
from omnistage.entrypoints.openai.settings import ServerSettings

_SIZE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")
MIN_SIDE = 8
MAX_SIDE = 8192


class DiffusionFields(BaseModel):
    """Extension fields every diffusion route accepts (documented in the README)."""

    model_config = ConfigDict(extra="allow")

    negative_prompt: str | None = None
    num_inference_steps: int | None = Field(default=None, ge=1, le=1000)
    guidance_scale: float | None = Field(default=None, ge=0)
    true_cfg_scale: float | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    lora: LoraRequest | None = None
    """A LoRA adapter by name ({"name": ..., "scale": ...}), or a file loaded on first use
    ({"name": ..., "path": ...}, deploy `max_loras`)."""

    def diffusion_fields(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in DiffusionFields.model_fields if getattr(self, k) is not None}

    def extras(self, decode_strings: bool = False) -> dict[str, Any]:
        """Fields the request sent that no route field names: the model's declared extras
        (checked against them by the engine; unknown names are a 400 there). Form values
        arrive as strings, so with `decode_strings` a value that parses as JSON is decoded."""
        out = dict(self.model_extra or {})
        if decode_strings:
            out = {k: _json_or_str(v, k) for k, v in out.items()}
        return out


def _json_or_str(value: Any, param: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json_body.loads(value, param)
    except json_body.BadJSON as e:
        if e.is_syntax:
            return value
        raise bad_request(e.message, param=param) from None


def check_model(requested: str | None, settings: ServerSettings) -> None:
    """A request may omit `model`, or name the served model (or its path)."""
    if requested is None or requested in (settings.served_model_name, settings.model_path):
        return
    raise APIError(404, f"the model {requested!r} does not exist; this server serves {settings.served_model_name!r}",
                   param="model", code="model_not_found")


def parse_size(value: str, settings: ServerSettings, param: str = "size") -> tuple[int, int]:
    """'WIDTHxHEIGHT' -> (width, height), within the side and pixel limits."""
    match = _SIZE.match(value)
    if not match:
        raise bad_request(f"{param}: expected 'WIDTHxHEIGHT' such as '1024x1024', got {value!r}", param=param,
                          code="invalid_size")
    width, height = int(match.group(1)), int(match.group(2))
    check_dims(width, height, settings, param)
    return width, height


def check_dims(width: int, height: int, settings: ServerSettings, param: str = "size") -> None:
    for side, name in ((width, "width"), (height, "height")):
        if not MIN_SIDE <= side <= MAX_SIDE:
            raise bad_request(f"{param}: {name} must be in [{MIN_SIDE}, {MAX_SIDE}], got {side}", param=param,
                              code="invalid_size")
    if width * height > settings.max_pixels:
        raise bad_request(f"{param}: {width}x{height} is {width * height} pixels, over the server's limit of "
                          f"{settings.max_pixels}", param=param, code="invalid_size")


def check_n(n: int, settings: ServerSettings) -> None:
    if n > settings.max_n:
        raise bad_request(f"n: at most {settings.max_n} per request, got {n}", param="n")


def validate(model: type[BaseModel], values: dict[str, Any]) -> Any:
    """`model.model_validate(values)`, its errors as our 400."""
    try:
        return model.model_validate(values)
    except ValidationError as e:
        raise from_validation_errors(e.errors()) from None


def require_json(request: Request) -> None:
    """Dependency for JSON routes: anything else is a 415."""
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise APIError(415, f"expected Content-Type: application/json, got {content_type or 'none'!r}",
                       code="unsupported_media_type")


class Form:
    """A parsed form: single-valued text fields, and uploads by field name.

    `image[]` (what the OpenAI client sends for a list) is read as `image`.
    """

    def __init__(self, fields: dict[str, str], files: dict[str, list[UploadFile]]):
        self.fields = fields
        self.files = files


async def read_form(request: Request, *, allow_urlencoded: bool, file_fields: tuple[str, ...],
                    url_fields: tuple[str, ...] = ()) -> Form:
    """The request's form; `url_fields` are file fields that may also be a text URL."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    allowed = ["multipart/form-data"] + (["application/x-www-form-urlencoded"] if allow_urlencoded else [])
    if content_type not in allowed:
        raise APIError(415, f"expected Content-Type {' or '.join(allowed)}, got {content_type or 'none'!r}",
                       code="unsupported_media_type")
    form = await request.form()
    fields: dict[str, str] = {}
    files: dict[str, list[UploadFile]] = {}
    for raw_key, value in form.multi_items():
        key = raw_key[:-2] if raw_key.endswith("[]") else raw_key
        if isinstance(value, UploadFile):
            if key not in file_fields:
                raise bad_request(f"{key}: unexpected file; file fields here: {', '.join(file_fields)}", param=key)
            files.setdefault(key, []).append(value)
        elif key in file_fields and key not in url_fields:
            raise bad_request(f"{key}: expected a file upload, got a text field", param=key)
        elif key in fields:
            raise bad_request(f"{key}: given more than once", param=key)
        else:
            fields[key] = value
    return Form(fields, files)


async def read_upload(upload: UploadFile, param: str) -> bytes:
    data = await upload.read()
    if not data:
        raise bad_request(f"{param}: the uploaded file is empty", param=param)
    return data


BROWSER_KEY_PROTOCOL = "openai-insecure-api-key."
"""A browser cannot set headers on a WebSocket: as OpenAI's Realtime API, it may send the key
as a subprotocol `openai-insecure-api-key.<key>` (beside `realtime`, the one accepted)."""


async def check_websocket_key(websocket: WebSocket, settings: ServerSettings) -> bool:
    """Whether the upgrade carries the API key (if one is set): `Authorization: Bearer`, or a
    browser's key subprotocol. If not, it is refused with close 1008. The HTTP auth middleware
    does not see WebSockets, so each WS route asks."""
    if not settings.api_key:
        return True
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    offered = [p[len(BROWSER_KEY_PROTOCOL):] for p in websocket.scope.get("subprotocols", [])
               if p.startswith(BROWSER_KEY_PROTOCOL)]
    tokens = ([token.strip()] if scheme.lower() == "bearer" else []) + offered
    if any(secrets.compare_digest(t.encode(), settings.api_key.encode()) for t in tokens):
        return True
    await websocket.close(code=1008, reason="invalid or missing API key")
    return False


def accepted_subprotocol(websocket: WebSocket) -> str | None:
    """`realtime` when the client offered it (a browser that offers subprotocols fails the
    connection unless the server picks one), else none."""
    return "realtime" if "realtime" in websocket.scope.get("subprotocols", []) else None


def event_object(message: dict[str, Any]) -> dict[str, Any]:
    """A WebSocket message of a JSON-events session (realtime, duplex, video chat) as one JSON
    object, or a 400 saying what is wrong with it."""
    if message.get("text") is None:
        raise bad_request("binary messages are not accepted; send JSON text events", code="invalid_event")
    try:
        event = json_body.loads(message["text"])
    except json_body.BadJSON as e:
        raise bad_request(e.message.replace("the request body", "the event"), param=e.param,
                          code="invalid_json") from None
    if not isinstance(event, dict):
        raise bad_request("an event must be a JSON object", code="invalid_event")
    return event


def typed_event(raw: dict[str, Any], events: dict[str, type[BaseModel]]) -> BaseModel:
    """A client event object (see event_object) as the model its `type` names in `events`, or a
    400 naming the unknown type or the bad field."""
    model = events.get(raw.get("type")) if isinstance(raw.get("type"), str) else None
    if model is None:
        raise bad_request(f"type: unknown event type {raw.get('type')!r}; one of {sorted(events)}",
                          param="type", code="invalid_event")
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise from_validation_errors(e.errors()) from None
