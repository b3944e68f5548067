"""Server settings: what `omnistage serve` flags set, passed to `create_app`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


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
    """Most images one images request may ask for (`n`)."""
    max_pixels: int = 2048 * 2048
    """Largest width x height one request may ask for (images and video frames)."""
    max_queued_requests: int = 64
    """Requests admitted to the engine at once (queued or running); more get 429."""
    file_ttl_s: float = 3600.0
    """How long `url` images and finished video jobs stay downloadable."""
    files_dir: str | None = None
    """Where served files live (default: a temporary folder removed at shutdown)."""
    playground: bool = True
    """Serve the web playground at `/` (`--no-playground` turns it off)."""

    def __post_init__(self) -> None:
        problems = [f"{name} must be >= 1, got {getattr(self, name)}"
                    for name in ("max_upload_bytes", "max_n", "max_pixels", "max_queued_requests")
                    if getattr(self, name) < 1]
        if self.file_ttl_s <= 0:
            problems.append(f"file_ttl_s must be > 0, got {self.file_ttl_s}")
        if problems:
            raise ValueError("invalid server settings: " + "; ".join(problems))
