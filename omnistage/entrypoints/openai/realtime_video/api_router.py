"""Route of the realtime video group: `WS /v1/realtime/video` (session.py). The gateway and
settings come from `app.state`."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, WebSocket

from omnistage.entrypoints.openai.common import check_websocket_key
from omnistage.entrypoints.openai.errors import bad_request
from omnistage.entrypoints.openai.json_body import JSONBodyRoute
from omnistage.entrypoints.openai.realtime_video.session import VideoStreamSession

router = APIRouter(route_class=JSONBodyRoute)
POLICY_VIOLATION = 1008


@router.websocket("/v1/realtime/video")
async def realtime_video(websocket: WebSocket) -> None:
    state = websocket.app.state
    if not await check_websocket_key(websocket, state.settings):
        return
    if not state.capabilities.serves("realtime.video"):
        await websocket.accept()
        error = bad_request(f"model {state.capabilities.model!r} does not make video", code="unsupported_route")
        await websocket.send_json({"type": "error", "message": error.message, "param": None, "code": error.code})
        await websocket.close(code=POLICY_VIOLATION)
        return
    await VideoStreamSession(websocket, state.gateway, state.settings).run()


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
