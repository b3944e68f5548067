"""Video jobs on disk: one SQLite file of job records, and each finished job's MP4 beside it.

    <directory>/jobs.sqlite3      one row per job: its id, its public object (JSON), its MP4 names
    <directory>/<video id>.mp4    the finished video (a job of n videos: then <video id>_1.mp4, ...)

So a restarted server lists and serves the jobs it finished before. A job that was
queued or running when the server stopped cannot resume (its engine request died with
the process): `open()` marks it `failed` with that reason instead of losing it. Deleting
or expiring a job removes its row and its file.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from omnistage.entrypoints.openai.videos.protocol import VideoError, VideoJob

UNFINISHED = ("queued", "in_progress")
INTERRUPTED = VideoError(code="server_restarted",
                         message="the server stopped before the job finished; create it again")


class VideoJobStore:
    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.directory / "jobs.sqlite3", isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS video_jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                         "id TEXT UNIQUE NOT NULL, job TEXT NOT NULL, file TEXT)")

    def load(self, now: int, ttl_s: float) -> list[tuple[VideoJob, list[str]]]:
        """Every stored job, oldest first; unfinished ones become `failed` (they cannot resume)."""
        rows = self._db.execute("SELECT job, file FROM video_jobs ORDER BY seq").fetchall()
        jobs = []
        for text, file in rows:
            job = VideoJob.model_validate_json(text)
            files = file.split("\n") if file else []  # names hold no newline: the one separator
            if job.status in UNFINISHED:
                job.status, job.error = "failed", INTERRUPTED
                job.completed_at, job.expires_at = now, int(now + ttl_s)
                self.save(job, files)
            jobs.append((job, files))
        return jobs

    def save(self, job: VideoJob, files: list[str] = ()) -> None:
        self._db.execute("INSERT INTO video_jobs (id, job, file) VALUES (?, ?, ?) "
                         "ON CONFLICT(id) DO UPDATE SET job = excluded.job, file = excluded.file",
                         (job.id, job.model_dump_json(), "\n".join(files) or None))

    def write_video(self, job_id: str, mp4: bytes, index: int = 0) -> str:
        """Store the job's video `index` (atomically: a crash leaves no half file under the final
        name); its file name."""
        name = f"{job_id}.mp4" if index == 0 else f"{job_id}_{index}.mp4"
        partial = self.directory / f".{name}.partial"
        partial.write_bytes(mp4)
        os.replace(partial, self.directory / name)
        return name

    def video_path(self, name: str) -> Path | None:
        path = self.directory / name
        return path if path.is_file() else None

    def delete(self, job_id: str, files: list[str]) -> None:
        self._db.execute("DELETE FROM video_jobs WHERE id = ?", (job_id,))
        for file in files:
            (self.directory / file).unlink(missing_ok=True)

    def close(self) -> None:
        self._db.close()
