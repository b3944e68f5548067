"""Routes of the realtime group: `WS /v1/realtime?model=...&duplex=...` (OpenAI's Realtime
protocol; full duplex on a duplex model) and `WS /v1/duplex` (full duplex only). The
handler comes from `app.state.realtime_serving`, which picks the session (serving.py)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, WebSocket

from omnistage.entrypoints.openai.common import check_websocket_key
from omnistage.entrypoints.openai.json_body import JSONBodyRoute

router = APIRouter(route_class=JSONBodyRoute)


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket, model: str | None = None, duplex: str | None = None) -> None:
    state = websocket.app.state
    if not await check_websocket_key(websocket, state.settings):
        return
    await state.realtime_serving.serve(websocket, model, duplex)


@router.websocket("/v1/duplex")
async def duplex(websocket: WebSocket, model: str | None = None) -> None:
    state = websocket.app.state
    if not await check_websocket_key(websocket, state.settings):
        return
    await state.realtime_serving.serve(websocket, model, native=True)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
