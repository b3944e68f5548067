"""Video jobs: validate the form, run the request in the background, keep the MP4.

A model that takes a control video (Wan-VACE) also reads `control_video` and `mask_video`
(uploads or URLs, decoded to frames here) and any number of `input_reference` images (its
reference images); others refuse those fields.

A job is one engine request, checked as its stage would check it on arrival before the
job is answered (bad params, a request that crashed the stage before: 400). Its status
follows OpenAI's lifecycle: `queued` until the first output, `in_progress` with
`progress` from the denoising steps, then `completed` (the MP4 is kept `file_ttl_s`) or
`failed` with an error naming the cause (a stage that refused or crashed on it later).
DELETE aborts a running job.
While a stage is down or restarting, no job is accepted (503 with Retry-After).

Jobs are durable (store.py): records in SQLite and MP4s under `files_dir/videos` (the
`--output-dir`), so finished jobs survive a restart; jobs running when the server stops
are recorded as `failed` with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request

from omnistage.diffusion.params import DiffusionParams
from omnistage.entrypoints.openai.capabilities import Capabilities
from omnistage.entrypoints.openai.common import Form, check_dims, check_model, parse_size, read_upload, validate
from omnistage.entrypoints.openai.engine_client import EngineGateway, RequestStream, cancel_on_disconnect
from omnistage.entrypoints.openai.errors import APIError, bad_request, from_value_error
from omnistage.entrypoints.openai.files import FileStore
from omnistage.entrypoints.openai.media_inputs import InputMedia
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.videos.protocol import (
    VideoCreateRequest,
    VideoDeleted,
    VideoError,
    VideoJob,
    VideoList,
)
from omnistage.entrypoints.openai.videos.store import VideoJobStore
from omnistage.media.video import encode_mp4

logger = logging.getLogger(__name__)

FILE_FIELDS = ("input_reference", "control_video", "mask_video")
CONTROL_FIELDS = {"control_video": "video", "mask_video": "mask"}  # form field -> the engine input's key
# The form field a pipeline's refusal names by its input key (a 400 names what the client sent).
FORM_PARAMS = {"image": "input_reference", **{key: field for field, key in CONTROL_FIELDS.items()}}
PROGRESS_SAVE_INTERVAL_S = 1.0  # progress reaches the job record at most this often
SHUTDOWN = VideoError(code="server_shutdown", message="the server stopped before the job finished; create it again")


@dataclass
class VideoTask:
    """A job as the server tracks it: the public object plus what runs it."""

    job: VideoJob
    task: asyncio.Task | None = None
    file_name: str | None = None


@dataclass
class VideoResult:
    mp4: bytes
    num_frames: int
    fps: float
    width: int
    height: int


class VideoServing:
    def __init__(self, gateway: EngineGateway, capabilities: Capabilities, settings: ServerSettings,
                 files: FileStore, media: InputMedia):
        self.gateway = gateway
        self.capabilities = capabilities
        self.settings = settings
        self.files = files
        self.media = media
        self._jobs: dict[str, VideoTask] = {}
        self._store: VideoJobStore | None = None
        self._stopping = False
        if settings.files_dir is not None and capabilities.serves("videos"):
            self._load()  # the jobs a previous run of the server left

    @property
    def store(self) -> VideoJobStore:
        """Opened on first use: without `files_dir` it lives in the files' temporary folder."""
        if self._store is None:
            root = Path(self.settings.files_dir) if self.settings.files_dir is not None else self.files.directory
            self._store = VideoJobStore(root / "videos")
        return self._store

    def _load(self) -> None:
        for job, file_name in self.store.load(int(time.time()), self.settings.file_ttl_s):
            self._jobs[job.id] = VideoTask(job, file_name=file_name)
        self._purge_expired()

    # --- requests -----------------------------------------------------------------

    async def _build(self, form: Form) -> tuple[VideoCreateRequest, Any, DiffusionParams]:
        """The edge checks of both create routes: (request, prompt, params) or a 4xx."""
        self.capabilities.require("videos")
        reference_url = form.fields.pop("input_reference", None)
        control_urls = {name: form.fields.pop(name, None) for name in CONTROL_FIELDS}
        body: VideoCreateRequest = validate(VideoCreateRequest, form.fields)
        check_model(body.model, self.settings)
        params = video_params(body, self.settings, decode_strings=True)
        images = await self._references(form, reference_url)
        media = {key: frames for name, key in CONTROL_FIELDS.items()
                 if (frames := await self._control(form, name, control_urls[name])) is not None}
        if images:
            media["image"] = images if len(images) > 1 else images[0]
        return body, ({"prompt": body.prompt, **media} if media else body.prompt), params

    async def _references(self, form: Form, url: str | None) -> list[Any]:
        """The input images: uploads, or a URL (fetched if its host is allowed, see media_fetch.py).
        An image-to-video model takes exactly one; a model that takes them optionally (Wan-VACE's
        reference images), any number."""
        uploads = form.files.get("input_reference", [])
        needs = self.capabilities.image_input
        if len(uploads) + (url is not None) > 1 and needs != "optional":
            raise bad_request("input_reference: give one image", param="input_reference")
        if not uploads and url is None:
            if needs == "required":
                raise bad_request(f"input_reference: model {self.capabilities.model!r} generates from an image; "
                                  "upload one", param="input_reference")
            return []
        if needs == "none":
            raise bad_request(f"input_reference: model {self.capabilities.model!r} is text-to-video and takes no "
                              "image", param="input_reference")
        images = [] if url is None else [await self.media.run(self.media.image_ref, url, "input_reference")]
        for upload in uploads:
            images.append(await self.media.image(await read_upload(upload, "input_reference"), "input_reference"))
        return images

    async def _control(self, form: Form, name: str, url: str | None) -> list[Any] | None:
        """A control video or its mask as frames (an upload or a URL), or None when not given."""
        uploads = form.files.get(name, [])
        if not uploads and url is None:
            return None
        if not self.capabilities.video_input:
            raise bad_request(f"{name}: model {self.capabilities.model!r} takes no control video", param=name)
        if len(uploads) + (url is not None) > 1:
            raise bad_request(f"{name}: give one video", param=name)
        if url is not None:
            return await self.media.run(self.media.video_frames_ref, url, name)
        return await self.media.video(await read_upload(uploads[0], name), name)

    # --- routes -------------------------------------------------------------------

    async def create(self, form: Form) -> VideoJob:
        body, prompt, params = await self._build(form)
        await self.gateway.require_healthy("video jobs are not accepted now")
        job_id = f"video_{uuid.uuid4().hex}"
        # What the stage would refuse on arrival is a 400 now, not a `queued` job that fails.
        with form_params():
            await self.gateway.check(prompt, params, job_id)
        stream = self.gateway.submit(prompt, params, job_id)
        size = body.size or (f"{body.width}x{body.height}" if body.width else None)
        job = VideoJob(id=job_id, model=self.settings.served_model_name, created_at=int(time.time()),
                       prompt=body.prompt, size=size, seconds=None if body.seconds is None else f"{body.seconds:g}",
                       num_frames=params.num_frames, fps=params.fps)
        entry = VideoTask(job)
        self._jobs[job_id] = entry
        self.store.save(job)
        entry.task = asyncio.create_task(self._run(entry, stream), name=f"omnistage-{job_id}")
        return job

    async def sync(self, form: Form, request: Request) -> VideoResult:
        _, prompt, params = await self._build(form)

        async def go() -> VideoResult:
            with form_params():
                stream = await self.gateway.open(prompt, params, f"video_sync_{uuid.uuid4().hex}")
            return await _encode(await stream.collect())

        return await cancel_on_disconnect(request, go())

    def get(self, video_id: str) -> VideoTask:
        self._purge_expired()
        entry = self._jobs.get(video_id)
        if entry is None:
            raise APIError(404, f"no video job {video_id!r}", param="video_id", code="video_not_found")
        return entry

    def list_jobs(self, after: str | None, limit: int, order: str) -> VideoList:
        self._purge_expired()
        jobs = [e.job for e in self._jobs.values()]
        if order == "desc":
            jobs.reverse()
        if after is not None:
            ids = [j.id for j in jobs]
            if after not in ids:
                raise bad_request(f"after: no video job {after!r}", param="after")
            jobs = jobs[ids.index(after) + 1:]
        page = jobs[:limit]
        return VideoList(data=page, first_id=page[0].id if page else None, last_id=page[-1].id if page else None,
                         has_more=len(jobs) > limit)

    def content_path(self, video_id: str) -> Any:
        entry = self.get(video_id)
        if entry.job.status != "completed":
            raise APIError(409, f"video {video_id!r} is {entry.job.status}, not completed", param="video_id",
                           code="video_not_ready")
        path = self.store.video_path(entry.file_name) if entry.file_name else None
        if path is None:
            raise APIError(404, f"video {video_id!r} has expired", param="video_id", code="video_expired")
        return path

    async def delete(self, video_id: str) -> VideoDeleted:
        entry = self.get(video_id)
        del self._jobs[video_id]
        if entry.task is not None and not entry.task.done():
            entry.task.cancel()  # closing the stream aborts the engine request
            await asyncio.gather(entry.task, return_exceptions=True)
        self.store.delete(video_id, entry.file_name)
        return VideoDeleted(id=video_id)

    async def shutdown(self) -> None:
        """Cancel running jobs (their engine requests are aborted; their records say why)."""
        self._stopping = True
        tasks = [e.task for e in self._jobs.values() if e.task is not None and not e.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._store is not None:
            self._store.close()
            self._store = None

    # --- the background job ---------------------------------------------------------

    async def _run(self, entry: VideoTask, stream: RequestStream) -> None:
        job = entry.job
        saved_at = 0.0
        try:
            final = None
            async for out in stream:
                started, job.status = job.status == "queued", "in_progress"
                if out.progress is not None and out.progress.num_steps:
                    # Decoding and encoding follow the last step: hold 99 until the MP4 exists.
                    job.progress = max(job.progress, min(99, 100 * out.progress.step // out.progress.num_steps))
                if started or time.monotonic() - saved_at > PROGRESS_SAVE_INTERVAL_S:
                    self.store.save(job)
                    saved_at = time.monotonic()
                final = out
            result = await _encode(final)
            entry.file_name = await asyncio.to_thread(self.store.write_video, job.id, result.mp4)
            job.expires_at = int(time.time() + self.settings.file_ttl_s)
            job.num_frames, job.fps = result.num_frames, result.fps
            job.size = f"{result.width}x{result.height}"
            job.seconds = f"{result.num_frames / result.fps:.3g}"
            job.progress, job.status, job.completed_at = 100, "completed", int(time.time())
        except APIError as e:
            job.status, job.error = "failed", VideoError(code=e.code or e.type, message=e.message)
        except asyncio.CancelledError:
            job.status = "failed"
            job.error = SHUTDOWN if self._stopping else VideoError(code="cancelled", message="the job was cancelled")
            raise
        except Exception as e:  # a bug must fail the job, not vanish in a task
            logger.exception("video job %s failed", job.id)
            job.status, job.error = "failed", VideoError(code="server_error", message=f"{type(e).__name__}: {e}")
        finally:
            if job.status == "failed":
                job.completed_at = int(time.time())
                job.expires_at = int(time.time() + self.settings.file_ttl_s)
            if job.id in self._jobs:  # not deleted meanwhile
                self.store.save(job, entry.file_name)

    def _purge_expired(self) -> None:
        now = time.time()
        for job_id in [i for i, e in self._jobs.items() if e.job.expires_at is not None and e.job.expires_at < now]:
            entry = self._jobs.pop(job_id)
            self.store.delete(job_id, entry.file_name)


def video_params(body: VideoCreateRequest, settings: ServerSettings, decode_strings: bool = False) -> DiffusionParams:
    """The diffusion params of a video request (a form, or `/v1/realtime/video`'s session.start);
    a 400 naming the field. Form values arrive as strings (`decode_strings`)."""
    width, height = _dims(body, settings)
    num_frames = body.num_frames
    if body.seconds is not None:
        if num_frames is not None:
            raise bad_request("give num_frames or seconds, not both", param="seconds")
        if body.fps is None:
            raise bad_request("seconds: also give fps (frames = seconds * fps + 1), or give num_frames",
                              param="seconds")
        num_frames = round(body.seconds * body.fps) + 1
    extras = body.extras(decode_strings=decode_strings)
    both = sorted(set(extras) & set(body.extra_params))
    if both:
        raise bad_request(f"{both} given both as fields and in extra_params", param="extra_params")
    try:
        return DiffusionParams(height=height, width=width, num_frames=num_frames, fps=body.fps,
                               guidance_scale_2=body.guidance_scale_2, extras={**body.extra_params, **extras},
                               **body.diffusion_fields())
    except ValueError as e:
        raise from_value_error(e) from None


def _dims(body: VideoCreateRequest, settings: ServerSettings) -> tuple[int | None, int | None]:
    if body.size is not None:
        if body.width is not None or body.height is not None:
            raise bad_request("give size or width/height, not both", param="size")
        return parse_size(body.size, settings)
    if (body.width is None) != (body.height is None):
        raise bad_request("give both width and height", param="width" if body.width is None else "height")
    if body.width is not None:
        check_dims(body.width, body.height, settings, param="width")
    return body.width, body.height


@contextmanager
def form_params() -> Iterator[None]:
    """Rename the input a refusal names to its form field (`video` -> `control_video`)."""
    try:
        yield
    except APIError as e:
        e.param = FORM_PARAMS.get(e.param, e.param)
        raise


async def _encode(out: Any) -> VideoResult:
    if out is None or out.video is None:
        raise APIError(500, "the model returned no video", type="server_error", code="engine_error")
    if not out.fps:
        raise APIError(500, "the model returned a video without fps", type="server_error", code="engine_error")
    frames, fps = out.video, float(out.fps)
    # A soundtrack (LTX-2) goes into the MP4 as an AAC track.
    mp4 = await asyncio.to_thread(encode_mp4, frames, fps, audio=out.audio, sample_rate=out.sample_rate)
    return VideoResult(mp4=mp4, num_frames=int(frames.shape[0]), fps=fps, width=int(frames.shape[2]),
                       height=int(frames.shape[1]))
