"""Routes of the sleep group; the handler comes from `app.state.sleep_serving`."""

from __future__ import annotations

from fastapi import APIRouter, Body, Depends, FastAPI, Request

from omnistage.entrypoints.openai.json_body import JSONBodyRoute
from omnistage.entrypoints.openai.sleep.protocol import SleepRequest, SleepState
from omnistage.entrypoints.openai.sleep.serving import SleepServing

router = APIRouter(route_class=JSONBodyRoute)


def serving(request: Request) -> SleepServing:
    return request.app.state.sleep_serving


@router.post("/v1/omni/sleep")
async def sleep(body: SleepRequest = Body(default_factory=SleepRequest),
                handler: SleepServing = Depends(serving)) -> SleepState:
    return await handler.sleep(body)


@router.post("/v1/omni/wakeup")
async def wake_up(handler: SleepServing = Depends(serving)) -> SleepState:
    return await handler.wake_up()


@router.get("/v1/omni/is_sleeping")
async def is_sleeping(handler: SleepServing = Depends(serving)) -> SleepState:
    return handler.state()


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
