"""Route of the realtime video group: `WS /v1/realtime/video` (session.py). The gateway and
settings come from `app.state`."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, WebSocket

from omnistage.entrypoints.openai.common import accepted_subprotocol, check_websocket_key
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
        await websocket.accept(subprotocol=accepted_subprotocol(websocket))
        error = bad_request(f"model {state.capabilities.model!r} does not make video", code="unsupported_route")
        await websocket.send_json({"type": "error", "message": error.message, "param": None, "code": error.code})
        await websocket.close(code=POLICY_VIOLATION)
        return
    await VideoStreamSession(websocket, state.gateway, state.settings, takes_prompt_updates(state.engine)).run()


def takes_prompt_updates(engine) -> bool:
    """Whether the served model's video stage takes a running request's new prompt (Helios)."""
    from omnistage.diffusion.registry import pipeline_class

    spec = getattr(engine, "spec", None)
    stages = [s for s in (spec.stages if spec is not None else ()) if s.final_output and s.kind == "diffusion"]
    return any(s.model is not None and getattr(pipeline_class(s.model), "takes_prompt_updates", False)
               for s in stages)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
