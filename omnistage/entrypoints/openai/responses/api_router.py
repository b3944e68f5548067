"""Routes of the Responses group; the handler comes from `app.state.responses_serving`.

    POST   /v1/responses                      create (JSON, or SSE events with stream: true)
    GET    /v1/responses/{id}                 a stored response
    DELETE /v1/responses/{id}                 forget it
    POST   /v1/responses/{id}/cancel          stop a background response
    GET    /v1/responses/{id}/input_items     the input items of its request, paged
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import StreamingResponse

from omnistage.entrypoints.openai.common import require_json
from omnistage.entrypoints.openai.json_body import JSONBodyRoute
from omnistage.entrypoints.openai.responses.protocol import ResponsesRequest
from omnistage.entrypoints.openai.responses.serving import ResponsesServing

router = APIRouter(route_class=JSONBodyRoute)


def serving(request: Request) -> ResponsesServing:
    return request.app.state.responses_serving


@router.post("/v1/responses", dependencies=[Depends(require_json)], response_model=None)
async def create_response(body: ResponsesRequest, request: Request,
                          handler: ResponsesServing = Depends(serving)) -> dict | StreamingResponse:
    result = await handler.create(body, request)
    if isinstance(result, dict):
        return result
    return StreamingResponse(result, media_type="text/event-stream", headers={"cache-control": "no-cache"})


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, handler: ResponsesServing = Depends(serving)) -> dict:
    return handler.get(response_id)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, handler: ResponsesServing = Depends(serving)) -> dict:
    return await handler.delete(response_id)


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, handler: ResponsesServing = Depends(serving)) -> dict:
    return await handler.cancel(response_id)


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(response_id: str, limit: int = Query(20, ge=1, le=100),
                           order: Literal["asc", "desc"] = "desc", after: str | None = None,
                           handler: ResponsesServing = Depends(serving)) -> dict:
    return handler.input_items(response_id, limit, order, after)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
