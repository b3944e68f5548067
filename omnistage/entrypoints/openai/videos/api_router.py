"""Routes of the videos group; handlers come from `app.state.video_serving`."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import FileResponse, Response

from omnistage.entrypoints.openai.common import read_form
from omnistage.entrypoints.openai.json_body import JSONBodyRoute
from omnistage.entrypoints.openai.videos.protocol import VideoDeleted, VideoJob, VideoList
from omnistage.entrypoints.openai.videos.references import FILE_FIELDS, URL_FIELDS
from omnistage.entrypoints.openai.videos.serving import VideoServing, sync_response

router = APIRouter(route_class=JSONBodyRoute)


def serving(request: Request) -> VideoServing:
    return request.app.state.video_serving


@router.post("/v1/videos", response_model=VideoJob)
async def create_video(request: Request, handler: VideoServing = Depends(serving)) -> VideoJob:
    form = await read_form(request, allow_urlencoded=True, file_fields=FILE_FIELDS, url_fields=URL_FIELDS)
    return await handler.create(form)


@router.post("/v1/videos/sync")
async def create_video_sync(request: Request, handler: VideoServing = Depends(serving)) -> Response:
    form = await read_form(request, allow_urlencoded=True, file_fields=FILE_FIELDS, url_fields=URL_FIELDS)
    return sync_response(await handler.sync(form, request))


@router.get("/v1/videos", response_model=VideoList)
async def list_videos(after: str | None = None, limit: int = Query(default=20, ge=1, le=100),
                      order: Literal["asc", "desc"] = "desc",
                      handler: VideoServing = Depends(serving)) -> VideoList:
    return handler.list_jobs(after, limit, order)


@router.get("/v1/videos/{video_id}", response_model=VideoJob)
async def get_video(video_id: str, handler: VideoServing = Depends(serving)) -> VideoJob:
    return handler.get(video_id).job


@router.get("/v1/videos/{video_id}/content")
async def get_video_content(video_id: str, variant: Literal["video"] = "video", index: int = Query(default=0, ge=0),
                            handler: VideoServing = Depends(serving)) -> FileResponse:
    """`index`: which of the job's `n` videos (from 0)."""
    name = f"{video_id}.mp4" if index == 0 else f"{video_id}_{index}.mp4"
    return FileResponse(handler.content_path(video_id, index), media_type="video/mp4", filename=name)


@router.delete("/v1/videos/{video_id}", response_model=VideoDeleted)
async def delete_video(video_id: str, handler: VideoServing = Depends(serving)) -> VideoDeleted:
    return await handler.delete(video_id)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
