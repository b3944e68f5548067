"""Failures as typed values: what went wrong and whose fault it is, never text to parse.

A `RequestError` travels from where it is raised (an engine's input check, a family's
`check_inputs`) to the HTTP layer, which answers 400 naming `param`. A `StageOutput` that
carries an error says its kind with `ErrorKind`.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class ErrorKind(str, Enum):
    """Why a request failed (`StageOutput.error_kind`, `OmniOutput.error_kind`). None there
    means the engine itself failed (a 500)."""

    INVALID_REQUEST = "invalid_request"
    """The engine refused the request's inputs or params: the caller's mistake (a 400)."""
    UNAVAILABLE = "unavailable"
    """The stage's engine died or is restarting: a later try may work (a 503)."""

    __str__ = str.__str__  # format as the plain value on every Python version


class RequestError(ValueError):
    """A request an engine refuses because of its inputs or params: the caller's mistake (a
    400), never the engine's. `param` names the field (None: the request as a whole). It
    travels as a typed value from where it is raised to the HTTP layer: engines put it on
    the `StageOutput` (`error_kind=ErrorKind.INVALID_REQUEST`, `error_param`), nobody parses text."""

    def __init__(self, param: str | None, message: str):
        super().__init__(message)
        self.param = param
        self.message = message

    def __reduce__(self):  # picklable across stage processes
        return type(self), (self.param, self.message)


class RequestErrors(ValueError):
    """Several `RequestError`s found at once (e.g. every bad sampling param of one request),
    so the caller hears of all of them in one answer."""

    def __init__(self, errors: Iterable[RequestError]):
        self.errors = list(errors)
        if not self.errors:
            raise ValueError("RequestErrors needs at least one RequestError")
        super().__init__("; ".join(e.message for e in self.errors))

    def __reduce__(self):  # picklable across stage processes
        return type(self), (self.errors,)


class EngineUnavailableError(RuntimeError):
    """The engine takes no requests now (closed, or its loop crashed); a later try may work."""
