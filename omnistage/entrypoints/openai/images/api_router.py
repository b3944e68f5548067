"""Routes of the images group; handlers come from `app.state.image_serving`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request

from omnistage.entrypoints.openai.common import read_form, require_json
from omnistage.entrypoints.openai.images.protocol import ImageGenerationRequest, ImagesResponse
from omnistage.entrypoints.openai.images.serving import ImageServing

router = APIRouter()


def serving(request: Request) -> ImageServing:
    return request.app.state.image_serving


@router.post("/v1/images/generations", dependencies=[Depends(require_json)], response_model=ImagesResponse,
             response_model_exclude_none=True)
async def create_image(body: ImageGenerationRequest, request: Request,
                       handler: ImageServing = Depends(serving)) -> ImagesResponse:
    return await handler.generate(body, request)


@router.post("/v1/images/edits", response_model=ImagesResponse, response_model_exclude_none=True)
async def edit_image(request: Request, handler: ImageServing = Depends(serving)) -> ImagesResponse:
    form = await read_form(request, allow_urlencoded=False, file_fields=("image", "mask"))
    return await handler.edit(form, request)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
