"""What a WS /v1/video/chat/stream upgrade is checked against before its session starts: the
model answers in text and its checkpoint has a vision encoder (an omni or vision-language thinker)."""

from __future__ import annotations

import asyncio

from starlette.websockets import WebSocket

from omnistage.entrypoints.openai.capabilities import Capabilities, media_inputs
from omnistage.entrypoints.openai.common import accepted_subprotocol
from omnistage.entrypoints.openai.engine_client import EngineGateway
from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.entrypoints.openai.media_inputs import InputMedia
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.video_chat.session import VideoChatSession
from omnistage.entrypoints.openai.ws_session import POLICY_VIOLATION

_UNREAD = object()


class VideoChatServing:
    def __init__(self, gateway: EngineGateway, capabilities: Capabilities, settings: ServerSettings,
                 media: InputMedia):
        self.gateway = gateway
        self.capabilities = capabilities
        self.settings = settings
        self.media = media
        self._media_inputs = _UNREAD

    async def check(self) -> None:
        """400 (as an error event) when this server cannot hold a video chat session."""
        if self.gateway.engine is None or "text" not in self.capabilities.outputs:
            raise bad_request(f"model {self.capabilities.model!r} does not answer in text; /v1/video/chat/stream "
                              "needs a model that sees images and answers (Qwen2.5-Omni, Qwen3-Omni)",
                              code="unsupported_route")
        if self._media_inputs is _UNREAD:  # read from the checkpoint once, off the loop
            self._media_inputs = await asyncio.to_thread(media_inputs, self.settings.model_path)
        if self._media_inputs is not None and "image" not in self._media_inputs:
            raise bad_request(f"model {self.capabilities.model!r} takes no image input", code="unsupported_modality")

    async def serve(self, websocket: WebSocket) -> None:
        try:
            await self.check()
        except APIError as e:
            await websocket.accept(subprotocol=accepted_subprotocol(websocket))
            await websocket.send_json({"type": "error", "error": {"type": e.type, "code": e.code,
                                                                  "message": e.message, "param": e.param}})
            await websocket.close(code=POLICY_VIOLATION)
            return
        speaks = {"text", "audio"} <= self.capabilities.outputs
        await VideoChatSession(websocket, self.gateway, self.settings, self.media, speaks).run()
