"""Files the server hands out by URL: generated images (`response_format=url`) and videos.

Names are 32 random URL-safe bytes plus an extension, so a URL is its own capability
(browsers fetch it without the API key); each file expires `ttl_s` after it was
written and is deleted at the next write or read past that time. In the default
temporary folder files end with the server; in a given folder (`--output-dir`) they
outlive it: a restarted server serves the ones a previous run wrote until they expire,
as it does its video jobs. API server processes sharing one engine (`--api-server-count`)
share one folder: each serves the files the others wrote.
"""

from __future__ import annotations

import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path

MEDIA_TYPES = {".png": "image/png", ".jpeg": "image/jpeg", ".webp": "image/webp", ".mp4": "video/mp4"}
_NAME = re.compile(r"^[A-Za-z0-9_-]{43}\.[a-z0-9]{2,5}$")


class FileStore:
    def __init__(self, ttl_s: float, directory: str | None = None):
        self.ttl_s = ttl_s
        self._given = None if directory is None else Path(directory)
        self._directory: Path | None = None
        self._expiry: dict[str, float] = {}
        if self._given is not None and self._given.is_dir():  # what a previous run handed out
            for path in self._given.iterdir():
                if _NAME.match(path.name) and path.is_file():
                    self._expiry[path.name] = path.stat().st_mtime + ttl_s
            self.purge_expired()

    @property
    def directory(self) -> Path:
        """Created on first use: a server that never hands out a URL leaves nothing behind."""
        if self._directory is None:
            if self._given is not None:
                self._given.mkdir(parents=True, exist_ok=True)
                self._directory = self._given
            else:
                self._directory = Path(tempfile.mkdtemp(prefix="omnistage-files-"))
        return self._directory

    def put(self, data: bytes, suffix: str) -> tuple[str, int]:
        """Store `data`; return its name and the unix time it expires."""
        self.purge_expired()
        name = secrets.token_urlsafe(32) + suffix
        (self.directory / name).write_bytes(data)
        expires_at = time.time() + self.ttl_s
        self._expiry[name] = expires_at
        return name, int(expires_at)

    def path(self, name: str) -> Path | None:
        """The file's path, or None when the name is unknown or expired."""
        if not _NAME.match(name):
            return None
        if name not in self._expiry:  # in a shared folder, another API server process may have written it
            on_disk = self._given / name if self._given is not None else None
            if on_disk is None or not on_disk.is_file():
                return None
            self._expiry[name] = on_disk.stat().st_mtime + self.ttl_s
        if self._expiry[name] < time.time():
            self.delete(name)
            return None
        return self.directory / name

    def delete(self, name: str) -> None:
        self._expiry.pop(name, None)
        (self.directory / name).unlink(missing_ok=True)

    def purge_expired(self) -> None:
        now = time.time()
        for name in [n for n, t in self._expiry.items() if t < now]:
            self.delete(name)

    def close(self) -> None:
        """Remove the temporary folder; a given folder keeps its unexpired files for the next run."""
        if self._given is None:
            for name in list(self._expiry):
                self.delete(name)
            if self._directory is not None:
                shutil.rmtree(self._directory, ignore_errors=True)
        else:
            self.purge_expired()
        self._directory = None
