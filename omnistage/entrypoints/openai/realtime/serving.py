"""What a WS /v1/realtime upgrade is checked against before its session starts: the model
must answer in text and audio (an omni model) and take audio in; and which session it gets.

A full-duplex family (`PipelineSpec.duplex`, e.g. Moshi) gets a duplex session (duplex.py)
on WS /v1/duplex and on WS /v1/realtime, whose `duplex=0` it refuses (it has no turns).
Any other model gets the turn-based session; there `?duplex=1` falls back to it, as the
reference does, and `session.created.session.capabilities` says so (`"duplex": false`),
while WS /v1/duplex is refused ("Duplex API is not available")."""

from __future__ import annotations

import asyncio

from starlette.websockets import WebSocket

from omnistage.config import Duplex
from omnistage.entrypoints.openai.capabilities import Capabilities, media_inputs
from omnistage.entrypoints.openai.common import accepted_subprotocol, check_model
from omnistage.entrypoints.openai.engine_client import EngineGateway
from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.entrypoints.openai.realtime.duplex import DuplexSession, capabilities
from omnistage.entrypoints.openai.realtime.session import RealtimeSession
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.ws_session import POLICY_VIOLATION

_UNREAD = object()
_FLAGS = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}


class RealtimeServing:
    def __init__(self, gateway: EngineGateway, capabilities: Capabilities, settings: ServerSettings):
        self.gateway = gateway
        self.capabilities = capabilities
        self.settings = settings
        self._media_inputs = _UNREAD

    @property
    def duplex(self) -> Duplex | None:
        """The family's full-duplex hooks, or None (a turn-based model; a test's fake engine)."""
        return getattr(getattr(self.gateway.engine, "spec", None), "duplex", None)

    async def check(self, model: str | None) -> None:
        """400 (as an error event) when this server cannot hold a realtime session for `model`."""
        if not self.capabilities.serves("realtime"):
            raise bad_request(f"model {self.capabilities.model!r} does not answer in audio; /v1/realtime needs an "
                              "omni model (text and audio out)", code="unsupported_route")
        check_model(model, self.settings)
        if self._media_inputs is _UNREAD:  # read from the checkpoint once, off the loop
            self._media_inputs = await asyncio.to_thread(media_inputs, self.settings.model_path)
        if self._media_inputs is not None and "audio" not in self._media_inputs:
            raise bad_request(f"model {self.capabilities.model!r} takes no audio input", code="unsupported_modality")

    def session_mode(self, duplex: str | None, native: bool) -> tuple[bool, bool]:
        """(run a duplex session, the client asked for one) for `?duplex=` and the route."""
        asked = True if native else _FLAGS.get(duplex.lower()) if duplex is not None else None
        if duplex is not None and asked is None:
            raise bad_request(f"duplex: {duplex!r} is not one of {sorted(_FLAGS)}", param="duplex")
        if self.duplex is None:
            if native:
                raise bad_request(f"Duplex API is not available: model {self.capabilities.model!r} is not a "
                                  "full-duplex model; use WS /v1/realtime", code="unsupported_route")
            return False, bool(asked)
        if asked is False:
            raise bad_request(f"duplex: model {self.capabilities.model!r} serves full-duplex sessions only",
                              param="duplex")
        return True, True

    async def serve(self, websocket: WebSocket, model: str | None, duplex: str | None = None,
                    native: bool = False) -> None:
        try:
            await self.check(model)
            is_duplex, asked = self.session_mode(duplex, native)
        except APIError as e:
            await websocket.accept(subprotocol=accepted_subprotocol(websocket))
            await websocket.send_json({"type": "error", "error": {"type": e.type, "code": e.code,
                                                                  "message": e.message, "param": e.param}})
            await websocket.close(code=POLICY_VIOLATION)
            return
        name = self.settings.served_model_name
        if is_duplex:
            await DuplexSession(websocket, self.gateway, self.settings, name, self.duplex).run()
            return
        fallback = capabilities(None) if asked else None  # a turn-based session says so when duplex was asked
        await RealtimeSession(websocket, self.gateway, self.settings, name, capabilities=fallback).run()
