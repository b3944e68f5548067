"""Route of the completions group; the handler comes from `app.state.completion_serving`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import StreamingResponse

from omnistage.entrypoints.openai.common import require_json
from omnistage.entrypoints.openai.completions.protocol import Completion, CompletionRequest
from omnistage.entrypoints.openai.completions.serving import CompletionServing
from omnistage.entrypoints.openai.json_body import JSONBodyRoute

router = APIRouter(route_class=JSONBodyRoute)


def serving(request: Request) -> CompletionServing:
    return request.app.state.completion_serving


@router.post("/v1/completions", dependencies=[Depends(require_json)], response_model=None)
async def create_completion(body: CompletionRequest, request: Request,
                            handler: CompletionServing = Depends(serving)) -> Completion | StreamingResponse:
    result = await handler.create(body, request)
    if isinstance(result, Completion):
        return result
    return StreamingResponse(result, media_type="text/event-stream", headers={"cache-control": "no-cache"})


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
