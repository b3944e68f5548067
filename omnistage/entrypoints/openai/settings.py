"""Server settings: what `omnistage serve` flags set, passed to `create_app`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

DEFAULT_MAX_INPUT_PIXELS = 4096 * 4096


@dataclass
class ServerSettings:
    served_model_name: str
    """The `id` /v1/models lists; requests may name it (or omit `model`)."""
    model_path: str
    created: int = field(default_factory=lambda: int(time.time()))
    api_key: str | None = None
    """When set, every /v1 route needs `Authorization: Bearer <api_key>`."""
    max_upload_bytes: int = 64 * 1024 * 1024
    """Largest request body; larger ones get 413 before they are read."""
    max_n: int = 8
    """Most images or videos one images or videos request may ask for (`n`)."""
    max_pixels: int = 2048 * 2048
    """Largest width x height one request may ask for (images and video frames)."""
    max_input_pixels: int = DEFAULT_MAX_INPUT_PIXELS
    """Largest width x height of an input image (edit images, chat image_url, video
    references, masks): refused from its header, before decoding."""
    max_input_audio_seconds: float = 600.0
    """Longest input audio or video (chat input_audio / audio_url / video_url, voice samples), from its header."""
    allowed_media_domains: tuple[str, ...] = ()
    """Hosts whose media URLs the server fetches (see media_fetch.py); none: no URL is fetched."""
    allowed_local_media_path: str | None = None
    """The folder `file://` media URLs may name (none: no file URL is read)."""
    media_fetch_timeout_s: float = 10.0
    """The longest one media URL fetch may take, redirects included."""
    max_queued_requests: int = 64
    """Requests admitted to the engine at once (queued or running); more get 429."""
    file_ttl_s: float = 3600.0
    """How long `url` images and finished video jobs stay downloadable."""
    files_dir: str | None = None
    """Where served files live (default: a temporary folder removed at shutdown)."""
    response_ttl_s: float = 30 * 24 * 3600.0
    """How long a stored response (`store: true`) can be read or continued (as OpenAI: 30 days)."""
    max_stored_responses: int = 10000
    """Most responses kept; past it the oldest are dropped first."""
    public_docs: bool = False
    """With an API key: leave /openapi.json, /docs and /redoc open (they need the key otherwise)."""
    protect_metrics: bool = False
    """With an API key: /metrics needs it too (it stays open otherwise, for scrapers)."""
    realtime_max_session_s: float = 1800.0
    """Longest WS /v1/realtime session; then an error event and close 1008."""
    realtime_max_buffer_s: float = 60.0
    """Most audio a realtime session's input buffer holds uncommitted; more: error event and close 1009."""
    realtime_idle_timeout_s: float = 300.0
    """A realtime session with no client event (and no response running) this long is closed (1008)."""
    video_chat_prefill: bool = True
    """WS /v1/video/chat/stream prefills the prompt as frames arrive, so a query pays only for its
    question (`--no-video-chat-prefill`: each query prefills its whole prompt)."""
    realtime_prefill: bool = True
    """WS /v1/realtime prefills the user's turn while they speak, cut into clips of half a second,
    so an answer pays only for the last clip (`--no-realtime-prefill`: the turn is one clip,
    prefilled whole at the commit)."""
    playground: bool = True
    """Serve the web playground at `/` (`--no-playground` turns it off)."""
    api_server_count: int = 1
    """HTTP server processes sharing the port and one engine process (api_servers.py); 1: the
    server and the engine in one process."""

    def __post_init__(self) -> None:
        problems = [f"{name} must be >= 1, got {getattr(self, name)}"
                    for name in ("max_upload_bytes", "max_n", "max_pixels", "max_input_pixels", "max_queued_requests",
                             "max_stored_responses", "api_server_count")
                    if getattr(self, name) < 1]
        for name in ("max_input_audio_seconds", "media_fetch_timeout_s", "realtime_max_session_s",
                     "realtime_max_buffer_s", "realtime_idle_timeout_s"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        self.allowed_media_domains = tuple(self.allowed_media_domains)
        for name in ("file_ttl_s", "response_ttl_s"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if problems:
            raise ValueError("invalid server settings: " + "; ".join(problems))
