"""Route of the realtime group: `WS /v1/realtime?model=...` (OpenAI's Realtime protocol).
The handler comes from `app.state.realtime_serving`."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, WebSocket

from omnistage.entrypoints.openai.common import check_websocket_key
from omnistage.entrypoints.openai.json_body import JSONBodyRoute

router = APIRouter(route_class=JSONBodyRoute)


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket, model: str | None = None) -> None:
    state = websocket.app.state
    if not await check_websocket_key(websocket, state.settings):
        return
    await state.realtime_serving.serve(websocket, model)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
