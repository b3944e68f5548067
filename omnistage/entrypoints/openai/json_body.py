"""JSON from clients, parsed one way with the server's bounds: request bodies (every JSON
route's `JSONBodyRoute`), WebSocket messages, and JSON carried inside form fields
(`extra_params`).

Python's parser takes what JSON forbids and what our layers below cannot hold: `NaN` and
`Infinity`, `1e999` (an infinite float), integers of any size (a token id of 2**70 raises
OverflowError in torch), lone surrogates (`"\\ud800"`, which no tokenizer can encode), and
nesting thousands deep (RecursionError wherever the value is walked again). Each is a
`BadJSON` naming where it sits, which the routes answer with a 400. Bodies over
`OFF_LOOP_BYTES` are parsed in a thread so one large upload does not stall the event loop.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from omnistage.entrypoints.openai.errors import RequestBodyError, bad_request

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted (OpenAI's own bodies need under 10)."""
OFF_LOOP_BYTES = 256 * 1024
"""Bodies larger than this are parsed off the event loop."""
INT64 = 2**63

_SURROGATE = re.compile("[\ud800-\udfff]")


class BadJSON(ValueError):
    """JSON the server refuses; `param` is where (`messages[0].content`), None for the whole."""

    def __init__(self, message: str, param: str | None = None, *, is_syntax: bool = False):
        super().__init__(message)
        self.message = message
        self.param = param
        self.is_syntax = is_syntax
        """Not JSON at all (vs JSON with a value out of bounds)."""


def _refuse_constant(name: str) -> Any:
    raise BadJSON(f"{name} is not a JSON number; send a finite number")


def loads(text: str | bytes, param: str | None = None) -> Any:
    """Parse `text` and check every value in it (see the module doc); `param` prefixes the
    paths named in errors (the form field the JSON came in)."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except BadJSON as e:
        raise BadJSON(f"{param + ': ' if param else ''}{e.message}", param) from None
    except RecursionError:
        raise BadJSON(f"{param or 'the body'}: nested deeper than {MAX_DEPTH} levels", param) from None
    except ValueError as e:  # JSONDecodeError, or undecodable bytes
        raise BadJSON(f"{param + ': ' if param else 'the request body '}is not valid JSON ({e})", param,
                      is_syntax=True) from None
    check(value, param)
    return value


def check(value: Any, root: str | None = None) -> None:
    """Raise `BadJSON` for the first value JSON's data model has but ours cannot hold.
    Iterative, so depth costs no Python stack."""
    stack: list[tuple[Any, str | None, int]] = [(value, root, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                raise BadJSON(f"{path or 'the body'}: nested deeper than {MAX_DEPTH} levels", path)
            if isinstance(item, dict):
                for key, child in item.items():
                    if _SURROGATE.search(key):
                        raise BadJSON(f"{_join(path, repr(key))}: a key with a lone surrogate", path)
                    stack.append((child, _join(path, key), depth + 1))
            else:
                stack.extend((child, f"{path or ''}[{i}]", depth + 1) for i, child in enumerate(item))
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not -INT64 <= item < INT64:
                raise BadJSON(f"{path or 'value'}: {_short(item)} does not fit a 64-bit integer", path)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise BadJSON(f"{path or 'value'}: a number too large for a 64-bit float", path)
        elif isinstance(item, str) and _SURROGATE.search(item):
            raise BadJSON(f"{path or 'value'}: a lone UTF-16 surrogate is not text", path)


def _join(path: str | None, key: str) -> str:
    return f"{path}.{key}" if path else key


def _short(number: int) -> str:
    text = str(number)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"


async def parse_body(body: bytes) -> Any:
    """`loads(body)`, in a thread for large bodies."""
    if len(body) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(loads, body)
    return loads(body)


class _BoundedJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = await parse_body(await self.body())
            except BadJSON as e:
                # An HTTPException is what FastAPI's body parsing lets through unchanged.
                raise RequestBodyError(bad_request(e.message, param=e.param, code="invalid_json")) from None
        return self._json


class JSONBodyRoute(APIRoute):
    """The route class of every router: FastAPI reads JSON bodies through `loads`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            return await handler(_BoundedJSONRequest(request.scope, request.receive))

        return bounded
