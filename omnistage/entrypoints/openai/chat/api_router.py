"""Route of the chat group; the handler comes from `app.state.chat_serving`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import StreamingResponse

from omnistage.entrypoints.openai.chat.protocol import (
    ChatCompletion,
    ChatCompletionBatch,
    ChatCompletionBatchRequest,
    ChatCompletionRequest,
)
from omnistage.entrypoints.openai.chat.serving import ChatServing
from omnistage.entrypoints.openai.common import require_json
from omnistage.entrypoints.openai.json_body import JSONBodyRoute

router = APIRouter(route_class=JSONBodyRoute)


def serving(request: Request) -> ChatServing:
    return request.app.state.chat_serving


@router.post("/v1/chat/completions", dependencies=[Depends(require_json)], response_model=None)
async def create_chat_completion(body: ChatCompletionRequest, request: Request,
                                 handler: ChatServing = Depends(serving)) -> ChatCompletion | StreamingResponse:
    result = await handler.create(body, request)
    if isinstance(result, ChatCompletion):
        return result
    return StreamingResponse(result, media_type="text/event-stream", headers={"cache-control": "no-cache"})


@router.post("/v1/chat/completions/batch", dependencies=[Depends(require_json)])
async def create_chat_completion_batch(body: ChatCompletionBatchRequest, request: Request,
                                       handler: ChatServing = Depends(serving)) -> ChatCompletionBatch:
    return await handler.create_batch(body, request)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
