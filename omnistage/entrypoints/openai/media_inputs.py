"""The media a request sends (uploads, base64, data URLs, fetched URLs): limits, decoding, off the loop.

Decoding a hostile image on the event loop stalls every other request (a 140 KB PNG can
declare 144 megapixels), so `InputMedia`:

- refuses images over `max_input_pixels` (and over Pillow's bomb limit) from their
  header, and audio (and chat videos) over `max_input_audio_seconds` from its header, before decoding;
- decodes, resizes and fetches in its own small thread pool (`await media.image(...)`),
  or runs a whole request builder there (`await media.run(fn, ...)`) for routes that
  decode inside synchronous code;
- fetches URLs through `MediaFetcher` (see media_fetch.py for what is allowed) in a pool of
  its own, so slow hosts cannot occupy the decoders;
- gives each client (`CLIENT`, its address) at most half of either pool, so one client's
  slow URLs or large uploads leave room for everyone else's.

Every refusal is a 400 naming the field (`image_too_large`, `audio_too_long`,
`invalid_media_url`, or the decoder's message).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
from PIL import Image

from omnistage.entrypoints.openai.errors import bad_request
from omnistage.entrypoints.openai.media_fetch import MediaFetcher, MediaFetchError
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.media.audio import AudioTooLongError, decode_audio
from omnistage.media.image import ImageTooLargeError, decode_base64_payload, open_image
from omnistage.media.video import probe_video

DECODE_THREADS = 4
"""At most this many inputs are decoded at once: it also bounds their memory."""
MIN_IMAGE_SIDE = 8
"""Narrower images are refused: resized to a model's grid they become 0 pixels wide."""
MAX_ASPECT_RATIO = 200
"""Longer-than-wide (or wider) images are refused: vision processors (Qwen2-VL's) raise past it."""

FETCH_THREADS = 4
"""At most this many media URLs are fetched at once."""
CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("omnistage_media_client", default="")
"""Who the current request is from (set per request by the error-boundary middleware)."""

T = TypeVar("T")


class ClientShares:
    """At most `limit` jobs of one client at once. Thread-safe: `hold` may wait in any thread
    (a fetch waits in the decode thread its own client already holds)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._freed = threading.Condition()
        self._held: dict[str, int] = {}

    @contextmanager
    def hold(self, client: str) -> Iterator[None]:
        with self._freed:
            self._freed.wait_for(lambda: self._held.get(client, 0) < self.limit)
            self._held[client] = self._held.get(client, 0) + 1
        try:
            yield
        finally:
            with self._freed:
                self._held[client] -= 1
                if not self._held[client]:
                    del self._held[client]
                self._freed.notify_all()

    async def hold_async(self, client: str) -> None:
        """Wait (on the event loop, holding no thread) until `client` is under its share."""
        while True:
            with self._freed:
                if self._held.get(client, 0) < self.limit:
                    self._held[client] = self._held.get(client, 0) + 1
                    return
            await asyncio.sleep(0.01)

    def release(self, client: str) -> None:
        with self._freed:
            self._held[client] -= 1
            if not self._held[client]:
                del self._held[client]
            self._freed.notify_all()


class InputMedia:
    def __init__(self, settings: ServerSettings):
        self.max_pixels = settings.max_input_pixels
        self.max_audio_seconds = settings.max_input_audio_seconds
        self.fetcher = MediaFetcher(settings.allowed_media_domains, settings.allowed_local_media_path,
                                    max_bytes=settings.max_upload_bytes, timeout_s=settings.media_fetch_timeout_s)
        self._pool = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="omnistage-media")
        self._fetch_pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="omnistage-fetch")
        self.decode_shares = ClientShares(max(1, DECODE_THREADS // 2))
        self.fetch_shares = ClientShares(max(1, FETCH_THREADS // 2))

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the media pool (for builders that decode media synchronously), once
        the client is under its share of the pool."""
        client = CLIENT.get()
        await self.decode_shares.hold_async(client)
        try:
            call = functools.partial(contextvars.copy_context().run, fn, *args)  # the fetches read CLIENT
            return await asyncio.get_running_loop().run_in_executor(self._pool, call)
        finally:
            self.decode_shares.release(client)

    # --- async: from a route -------------------------------------------------------------------

    async def image(self, data: bytes, field: str, mode: str | None = "RGB") -> Image.Image:
        return await self.run(self.decode_image, data, field, mode)

    async def audio(self, data: bytes, field: str) -> tuple[np.ndarray, int]:
        return await self.run(self.decode_audio, data, field)

    async def video(self, data: bytes, field: str) -> list[Image.Image]:
        return await self.run(self.video_frames, data, field)

    # --- sync: in the pool -----------------------------------------------------------------------

    def decode_image(self, data: bytes, field: str, mode: str | None = "RGB") -> Image.Image:
        """Image bytes -> a PIL image (converted to `mode` unless None)."""
        try:
            image = open_image(data, field, self.max_pixels)
        except ImageTooLargeError as e:
            raise bad_request(str(e), param=field, code="image_too_large") from None
        except ValueError as e:
            raise bad_request(str(e), param=field, code="invalid_image") from None
        width, height = image.size
        if min(width, height) < MIN_IMAGE_SIDE or max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            raise bad_request(f"{field}: a {width}x{height} image; each side must be at least {MIN_IMAGE_SIDE} pixels "
                              f"and the longer at most {MAX_ASPECT_RATIO} times the shorter", param=field,
                              code="invalid_image")
        return image.convert(mode) if mode is not None else image

    def decode_audio(self, data: bytes, field: str) -> tuple[np.ndarray, int]:
        """Audio bytes -> (float32 mono, sample rate)."""
        try:
            return decode_audio(data, field=field, max_seconds=self.max_audio_seconds)
        except AudioTooLongError as e:
            raise bad_request(str(e), param=field, code="audio_too_long") from None
        except ValueError as e:
            raise bad_request(str(e), param=field, code="invalid_audio") from None

    def load(self, ref: str, field: str) -> bytes:
        """The bytes a reference names: a URL (fetched, if allowed), a data URL or bare base64."""
        try:
            if self.fetcher.is_url(ref):
                with self.fetch_shares.hold(CLIENT.get()):
                    return self._fetch_pool.submit(self.fetcher.fetch, ref, field).result()
            return decode_base64_payload(ref, field)
        except MediaFetchError as e:
            raise bad_request(str(e), param=field, code="invalid_media_url") from None
        except ValueError as e:
            raise bad_request(str(e), param=field) from None

    def video_ref(self, ref: str, field: str) -> bytes:
        """The encoded video a reference names, checked from its header and packets (decodable,
        frames within `max_input_pixels`, length within `max_input_audio_seconds`); the model
        samples and decodes the frames it reads."""
        return self.check_video(self.load(ref, field), field)

    def check_video(self, data: bytes, field: str) -> bytes:
        """`data` if it is a decodable video within the limits `video_ref` names, else a 400."""
        try:
            info = probe_video(data)
        except ValueError as e:
            raise bad_request(str(e), param=field, code="invalid_video") from None
        if info.width * info.height > self.max_pixels:
            raise bad_request(f"video frames of {info.width}x{info.height} exceed the server's {self.max_pixels} "
                              "pixels", param=field, code="video_too_large")
        if info.seconds > self.max_audio_seconds:
            raise bad_request(f"the video lasts {info.seconds:.1f} s, over the server's {self.max_audio_seconds:g} s",
                              param=field, code="video_too_long")
        return data

    def video_frames(self, data: bytes, field: str) -> list[Image.Image]:
        """Encoded video bytes (checked as `video_ref` checks them) -> every frame as an RGB PIL
        image (a control video the model reads whole)."""
        from omnistage.media.video import decode_video

        frames, _ = decode_video(self.check_video(data, field))
        return [Image.fromarray(frame) for frame in frames]

    def video_frames_ref(self, ref: str, field: str) -> list[Image.Image]:
        return self.video_frames(self.load(ref, field), field)

    def image_ref(self, ref: str, field: str) -> Image.Image:
        return self.decode_image(self.load(ref, field), field)

    def audio_ref(self, ref: str, field: str) -> tuple[np.ndarray, int]:
        return self.decode_audio(self.load(ref, field), field)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._fetch_pool.shutdown(wait=False, cancel_futures=True)

