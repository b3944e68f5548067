"""Routes of the weights group; the handler comes from `app.state.weights_serving`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request

from omnistage.entrypoints.openai.json_body import JSONBodyRoute
from omnistage.entrypoints.openai.weights.protocol import UpdateWeightsRequest, UpdateWeightsResponse
from omnistage.entrypoints.openai.weights.serving import WeightsServing

router = APIRouter(route_class=JSONBodyRoute)


def serving(request: Request) -> WeightsServing:
    return request.app.state.weights_serving


@router.post("/v1/omni/update_weights")
async def update_weights(body: UpdateWeightsRequest, handler: WeightsServing = Depends(serving)) -> UpdateWeightsResponse:
    return await handler.update_weights(body)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
