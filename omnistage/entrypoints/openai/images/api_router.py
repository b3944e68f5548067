"""Routes of the images group; handlers come from `app.state.image_serving`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import StreamingResponse

from omnistage.entrypoints.openai.common import read_form, require_json
from omnistage.entrypoints.openai.images.protocol import ImageGenerationRequest, ImagesResponse
from omnistage.entrypoints.openai.images.serving import ImageServing
from omnistage.entrypoints.openai.json_body import JSONBodyRoute

router = APIRouter(route_class=JSONBodyRoute)


def serving(request: Request) -> ImageServing:
    return request.app.state.image_serving


# With `stream: true` both routes answer Server-Sent Events instead of the JSON body.
_SSE = {200: {"content": {"text/event-stream": {}}, "description": "`stream: true`: partial and completed image events"}}


def _respond(result: ImagesResponse | object) -> ImagesResponse | StreamingResponse:
    if isinstance(result, ImagesResponse):
        return result
    return StreamingResponse(result, media_type="text/event-stream", headers={"cache-control": "no-cache"})


@router.post("/v1/images/generations", dependencies=[Depends(require_json)], response_model=ImagesResponse,
             response_model_exclude_none=True, responses=_SSE)
async def create_image(body: ImageGenerationRequest, request: Request,
                       handler: ImageServing = Depends(serving)) -> ImagesResponse | StreamingResponse:
    return _respond(await handler.generate(body, request))


@router.post("/v1/images/edits", response_model=ImagesResponse, response_model_exclude_none=True, responses=_SSE)
async def edit_image(request: Request, handler: ImageServing = Depends(serving)) -> ImagesResponse | StreamingResponse:
    form = await read_form(request, allow_urlencoded=False, file_fields=("image", "mask"))
    return _respond(await handler.edit(form, request))


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
