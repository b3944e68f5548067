"""What a WS /v1/realtime upgrade is checked against before its session starts: the model
must answer in text and audio (an omni model) and take audio in."""

from __future__ import annotations

import asyncio

from starlette.websockets import WebSocket

from omnistage.entrypoints.openai.capabilities import Capabilities, media_inputs
from omnistage.entrypoints.openai.common import accepted_subprotocol, check_model
from omnistage.entrypoints.openai.engine_client import EngineGateway
from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.entrypoints.openai.realtime.session import POLICY_VIOLATION, RealtimeSession
from omnistage.entrypoints.openai.settings import ServerSettings

_UNREAD = object()


class RealtimeServing:
    def __init__(self, gateway: EngineGateway, capabilities: Capabilities, settings: ServerSettings):
        self.gateway = gateway
        self.capabilities = capabilities
        self.settings = settings
        self._media_inputs = _UNREAD

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

    async def serve(self, websocket: WebSocket, model: str | None) -> None:
        try:
            await self.check(model)
        except APIError as e:
            await websocket.accept(subprotocol=accepted_subprotocol(websocket))
            await websocket.send_json({"type": "error", "error": {"type": e.type, "code": e.code,
                                                                  "message": e.message, "param": e.param}})
            await websocket.close(code=POLICY_VIOLATION)
            return
        await RealtimeSession(websocket, self.gateway, self.settings, self.settings.served_model_name).run()
