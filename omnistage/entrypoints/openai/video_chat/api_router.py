"""Route of the video chat group: `WS /v1/video/chat/stream` (session.py). The handler comes
from `app.state.video_chat_serving`."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, WebSocket

from omnistage.entrypoints.openai.common import check_websocket_key
from omnistage.entrypoints.openai.json_body import JSONBodyRoute

router = APIRouter(route_class=JSONBodyRoute)


@router.websocket("/v1/video/chat/stream")
async def video_chat_stream(websocket: WebSocket) -> None:
    state = websocket.app.state
    if not await check_websocket_key(websocket, state.settings):
        return
    await state.video_chat_serving.serve(websocket)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
