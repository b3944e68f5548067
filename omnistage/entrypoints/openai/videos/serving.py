"""Video jobs: validate the form, run the request in the background, keep the MP4s.

The form's media (`input_reference`, repeated `input_references`, `control_video`,
`mask_video`, `audio_reference`) is read by references.py within what the model takes.
Fields of the reference system's video forms that this server does not take are a 400
naming them (protocol.REFUSED_FIELDS).

`n` videos are `n` engine requests (video i with `seed + i`, so each can be made again
alone), admitted together and run side by side (the engine batches what fits); the job's
`progress` is their mean, and a failure of one fails the job and aborts the others. The
sync route answers one MP4, or with `n` > 1 a `multipart/mixed` body of one MP4 part each.

A job is checked as its stage would check it on arrival before the job is answered (bad
params, a request that crashed the stage before: 400). Its status follows OpenAI's
lifecycle: `queued` until the first output, `in_progress` with `progress` from the
denoising steps, then `completed` (the MP4s are kept `file_ttl_s`) or `failed` with an
error naming the cause (a stage that refused or crashed on it later). DELETE aborts a
running job. While a stage is down or restarting, no job is accepted (503 with Retry-After).

Jobs are durable (store.py): records in SQLite and MP4s under `files_dir/videos` (the
`--output-dir`), so finished jobs survive a restart; jobs running when the server stops
are recorded as `failed` with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from omnistage.diffusion.params import DiffusionParams
from omnistage.entrypoints.openai.capabilities import Capabilities
from omnistage.entrypoints.openai.common import Form, check_dims, check_model, check_n, parse_size, validate
from omnistage.entrypoints.openai.engine_client import EngineGateway, RequestStream, cancel_on_disconnect
from omnistage.entrypoints.openai.errors import APIError, bad_request, from_value_error
from omnistage.entrypoints.openai.files import FileStore
from omnistage.entrypoints.openai.media_inputs import InputMedia
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.entrypoints.openai.videos.protocol import (
    REFUSED_FIELDS,
    VideoCreateRequest,
    VideoDeleted,
    VideoError,
    VideoJob,
    VideoJobRequest,
    VideoList,
)
from omnistage.entrypoints.openai.videos.references import URL_FIELDS, VideoReferences
from omnistage.entrypoints.openai.videos.store import VideoJobStore
from omnistage.media.video import encode_mp4

logger = logging.getLogger(__name__)
T = TypeVar("T")

# The form field a pipeline's refusal names by its input key, when the form does not say
# (a 400 names what the client sent).
FORM_PARAMS = {"image": "input_reference", "video": "control_video", "mask": "mask_video"}
PROGRESS_SAVE_INTERVAL_S = 1.0  # progress reaches the job record at most this often
SHUTDOWN = VideoError(code="server_shutdown", message="the server stopped before the job finished; create it again")


@dataclass
class VideoTask:
    """A job as the server tracks it: the public object plus what runs it."""

    job: VideoJob
    task: asyncio.Task | None = None
    file_names: list[str] = field(default_factory=list)


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
        self.references = VideoReferences(capabilities, media)
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
        for job, file_names in self.store.load(int(time.time()), self.settings.file_ttl_s):
            self._jobs[job.id] = VideoTask(job, file_names=file_names)
        self._purge_expired()

    # --- requests -----------------------------------------------------------------

    async def _build(self, form: Form) -> tuple[VideoJobRequest, Any, list[DiffusionParams], dict[str, str]]:
        """The edge checks of both create routes: (request, prompt, the params of each of the n
        videos, engine input -> form field) or a 4xx."""
        self.capabilities.require("videos")
        for name, instead in REFUSED_FIELDS.items():
            if name in form.fields:
                raise bad_request(f"{name}: not a field of this server's video API; {instead}", param=name)
        urls = {name: form.fields.pop(name, None) for name in URL_FIELDS}
        body: VideoJobRequest = validate(VideoJobRequest, form.fields)
        check_model(body.model, self.settings)
        check_n(body.n, self.settings)
        params = video_params(body, self.settings, decode_strings=True)
        inputs = await self.references.read(form, urls, body.audio_reference)
        prompt = {"prompt": body.prompt, **inputs.media} if inputs.media else body.prompt
        return body, prompt, [_nth(params, i) for i in range(body.n)], inputs.fields

    async def _submit(self, prompt: Any, params: list[DiffusionParams], request_id: str) -> list[RequestStream]:
        """Admit the n requests of a job together: if one is refused (429), none stays admitted.
        One video's request id is the job's; video i of several is `<id>_<i>`."""
        ids = [request_id] if len(params) == 1 else [f"{request_id}_{i}" for i in range(len(params))]
        streams: list[RequestStream] = []
        try:
            for p, i in zip(params, ids):
                streams.append(self.gateway.submit(prompt, p, i))
        except BaseException:
            await asyncio.gather(*(stream.close() for stream in streams))
            raise
        return streams

    # --- routes -------------------------------------------------------------------

    async def create(self, form: Form) -> VideoJob:
        body, prompt, params, fields = await self._build(form)
        await self.gateway.require_healthy("video jobs are not accepted now")
        job_id = f"video_{uuid.uuid4().hex}"
        # What the stage would refuse on arrival is a 400 now, not a `queued` job that fails.
        # The n requests differ only in their seeds: checking one checks them all.
        with form_params(fields):
            await self.gateway.check(prompt, params[0], job_id)
            streams = await self._submit(prompt, params, job_id)
        size = body.size or (f"{body.width}x{body.height}" if body.width else None)
        job = VideoJob(id=job_id, model=self.settings.served_model_name, created_at=int(time.time()),
                       prompt=body.prompt, size=size, seconds=None if body.seconds is None else f"{body.seconds:g}",
                       num_frames=params[0].num_frames, fps=params[0].fps, n=body.n)
        entry = VideoTask(job)
        self._jobs[job_id] = entry
        self.store.save(job)
        entry.task = asyncio.create_task(self._run(entry, streams), name=f"omnistage-{job_id}")
        return job

    async def sync(self, form: Form, request: Request) -> list[VideoResult]:
        _, prompt, params, fields = await self._build(form)

        async def go() -> list[VideoResult]:
            with form_params(fields):
                streams = await self._submit(prompt, params, f"video_sync_{uuid.uuid4().hex}")
            try:
                with form_params(fields):  # the first outputs: an engine refusal is a 400
                    await all_of([stream.start() for stream in streams])
                return await all_of([_collect_and_encode(stream) for stream in streams])
            finally:
                await asyncio.gather(*(stream.close() for stream in streams))

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

    def content_path(self, video_id: str, index: int = 0) -> Any:
        entry = self.get(video_id)
        if entry.job.status != "completed":
            raise APIError(409, f"video {video_id!r} is {entry.job.status}, not completed", param="video_id",
                           code="video_not_ready")
        if not 0 <= index < entry.job.n:
            raise bad_request(f"index: job {video_id!r} made {entry.job.n} video(s) (index 0 to {entry.job.n - 1}), "
                              f"got {index}", param="index")
        path = self.store.video_path(entry.file_names[index]) if index < len(entry.file_names) else None
        if path is None:
            raise APIError(404, f"video {video_id!r} has expired", param="video_id", code="video_expired")
        return path

    async def delete(self, video_id: str) -> VideoDeleted:
        entry = self.get(video_id)
        del self._jobs[video_id]
        if entry.task is not None and not entry.task.done():
            entry.task.cancel()  # closing the stream aborts the engine request
            await asyncio.gather(entry.task, return_exceptions=True)
        self.store.delete(video_id, entry.file_names)
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

    async def _run(self, entry: VideoTask, streams: list[RequestStream]) -> None:
        job = entry.job
        fractions = [0.0] * len(streams)  # each video's share of its denoising steps done
        saved_at = 0.0

        async def follow(i: int, stream: RequestStream) -> VideoResult:
            nonlocal saved_at
            final = None
            async for out in stream:
                started, job.status = job.status == "queued", "in_progress"
                if out.progress is not None and out.progress.num_steps:
                    fractions[i] = out.progress.step / out.progress.num_steps
                    # Decoding and encoding follow the last step: hold 99 until the MP4s exist.
                    job.progress = max(job.progress, min(99, int(100 * sum(fractions) / len(fractions))))
                if started or time.monotonic() - saved_at > PROGRESS_SAVE_INTERVAL_S:
                    self.store.save(job)
                    saved_at = time.monotonic()
                final = out
            return await _encode(final)

        try:
            results = await all_of([follow(i, stream) for i, stream in enumerate(streams)])
            for i, result in enumerate(results):
                entry.file_names.append(await asyncio.to_thread(self.store.write_video, job.id, result.mp4, i))
            result = results[0]
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
                self.store.save(job, entry.file_names)

    def _purge_expired(self) -> None:
        now = time.time()
        for job_id in [i for i, e in self._jobs.items() if e.job.expires_at is not None and e.job.expires_at < now]:
            entry = self._jobs.pop(job_id)
            self.store.delete(job_id, entry.file_names)


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


def _nth(params: DiffusionParams, i: int) -> DiffusionParams:
    """The params of a job's video i: its seed is `seed + i` (each may be made again alone)."""
    if i == 0 or params.seed is None:
        return params
    return params.model_copy(update={"seed": (params.seed + i) % 2**63})


async def all_of(aws: list[Awaitable[T]]) -> list[T]:
    """`gather`, except that the first failure cancels the others (a job's other videos are
    aborted, not left running) before it propagates."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextmanager
def form_params(fields: dict[str, str] | None = None) -> Iterator[None]:
    """Rename the input a refusal names to the form field it came from (`fields`, else
    FORM_PARAMS: `video` -> `control_video`)."""
    try:
        yield
    except APIError as e:
        e.param = (fields or {}).get(e.param) or FORM_PARAMS.get(e.param, e.param)
        raise


def sync_response(results: list[VideoResult]) -> Response:
    """One MP4; or for n videos a `multipart/mixed` body of one MP4 part each, with the headers
    a single answer has (x-num-frames, x-fps, x-video-size)."""
    if len(results) == 1:
        return Response(results[0].mp4, media_type="video/mp4", headers=_headers(results[0]))
    boundary = uuid.uuid4().hex
    parts = []
    for i, result in enumerate(results):
        head = {"content-type": "video/mp4", "content-disposition": f'attachment; filename="video_{i}.mp4"',
                **_headers(result)}
        parts += [f"--{boundary}\r\n".encode(), "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode(),
                  b"\r\n", result.mp4, b"\r\n"]
    parts.append(f"--{boundary}--\r\n".encode())
    return Response(b"".join(parts), media_type=f"multipart/mixed; boundary={boundary}")


def _headers(result: VideoResult) -> dict[str, str]:
    return {"x-num-frames": str(result.num_frames), "x-fps": f"{result.fps:g}",
            "x-video-size": f"{result.width}x{result.height}"}


async def _collect_and_encode(stream: RequestStream) -> VideoResult:
    return await _encode(await stream.collect())


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
