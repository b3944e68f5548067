"""The media a request sends (uploads, base64, data URLs, fetched URLs): limits, decoding, off the loop.

Decoding a hostile image on the event loop stalls every other request (a 140 KB PNG can
declare 144 megapixels), so `InputMedia`:

- refuses images over `max_input_pixels` (and over Pillow's bomb limit) from their
  header, and audio (and chat videos) over `max_input_audio_seconds` from its header, before decoding;
- decodes, resizes and fetches in its own small thread pool (`await media.image(...)`),
  or runs a whole request builder there (`await media.run(fn, ...)`) for routes that
  decode inside synchronous code;
- fetches URLs through `MediaFetcher` (see media_fetch.py for what is allowed).

Every refusal is a 400 naming the field (`image_too_large`, `audio_too_long`,
`invalid_media_url`, or the decoder's message).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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

T = TypeVar("T")


class InputMedia:
    def __init__(self, settings: ServerSettings):
        self.max_pixels = settings.max_input_pixels
        self.max_audio_seconds = settings.max_input_audio_seconds
        self.fetcher = MediaFetcher(settings.allowed_media_domains, settings.allowed_local_media_path,
                                    max_bytes=settings.max_upload_bytes, timeout_s=settings.media_fetch_timeout_s)
        self._pool = ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="omnistage-media")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the media pool (for builders that decode media synchronously)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    # --- async: from a route -------------------------------------------------------------------

    async def image(self, data: bytes, field: str, mode: str | None = "RGB") -> Image.Image:
        return await self.run(self.decode_image, data, field, mode)

    async def audio(self, data: bytes, field: str) -> tuple[np.ndarray, int]:
        return await self.run(self.decode_audio, data, field)

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
                return self.fetcher.fetch(ref, field)
            return decode_base64_payload(ref, field)
        except MediaFetchError as e:
            raise bad_request(str(e), param=field, code="invalid_media_url") from None
        except ValueError as e:
            raise bad_request(str(e), param=field) from None

    def video_ref(self, ref: str, field: str) -> bytes:
        """The encoded video a reference names, checked from its header and packets (decodable,
        frames within `max_input_pixels`, length within `max_input_audio_seconds`); the model
        samples and decodes the frames it reads."""
        data = self.load(ref, field)
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

    def image_ref(self, ref: str, field: str) -> Image.Image:
        return self.decode_image(self.load(ref, field), field)

    def audio_ref(self, ref: str, field: str) -> tuple[np.ndarray, int]:
        return self.decode_audio(self.load(ref, field), field)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

