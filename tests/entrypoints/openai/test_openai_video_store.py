"""Durable video jobs: records in SQLite and MP4s under the output directory survive a
restart; jobs unfinished at shutdown (or at a crash) are `failed` with the reason; expiry
removes record and file."""

from __future__ import annotations

import sqlite3
import time

from fake_engine import make_client
from test_openai_videos import _wait

from omnistage.entrypoints.openai.videos.protocol import VideoJob
from omnistage.entrypoints.openai.videos.store import VideoJobStore

FORM = {"prompt": "a wave", "size": "32x16", "num_frames": "5", "fps": "8"}


def rows(directory) -> list[tuple[str, str]]:
    with sqlite3.connect(directory / "videos" / "jobs.sqlite3") as db:
        return db.execute("SELECT id, file FROM video_jobs ORDER BY seq").fetchall()


def test_finished_jobs_survive_a_restart_and_running_ones_fail_with_the_reason(tmp_path):
    http, _ = make_client("video", files_dir=str(tmp_path), step_delay=0.02)
    with http:
        done = http.post("/v1/videos", data=FORM).json()
        _wait(http, done["id"])
        mp4 = http.get(f"/v1/videos/{done['id']}/content").content
        slow = http.post("/v1/videos", data={**FORM, "num_inference_steps": "1000"}).json()
        _wait(http, slow["id"], status="in_progress")
    # The app has shut down (its lifespan ran): a new one over the same folder.
    http, _ = make_client("video", files_dir=str(tmp_path))
    with http:
        listed = http.get("/v1/videos", params={"order": "asc"}).json()["data"]
        assert [j["id"] for j in listed] == [done["id"], slow["id"]]
        assert listed[0]["status"] == "completed" and listed[0]["num_frames"] == 5
        assert http.get(f"/v1/videos/{done['id']}/content").content == mp4
        assert listed[1]["status"] == "failed" and listed[1]["error"]["code"] == "server_shutdown"
        assert http.delete(f"/v1/videos/{done['id']}").status_code == 200
    assert [r[0] for r in rows(tmp_path)] == [slow["id"]]
    assert not (tmp_path / "videos" / f"{done['id']}.mp4").exists()


def test_a_job_left_running_by_a_crash_is_failed_at_the_next_start(tmp_path):
    store = VideoJobStore(tmp_path / "videos")
    store.save(VideoJob(id="video_crashed", model="fake-video", created_at=1, prompt="x", status="in_progress",
                        progress=40))
    store.close()  # the server died here: nothing marked the job
    http, _ = make_client("video", files_dir=str(tmp_path))
    with http:
        job = http.get("/v1/videos/video_crashed").json()
        assert job["status"] == "failed" and job["error"]["code"] == "server_restarted" and job["expires_at"]
        assert http.get("/v1/videos/video_crashed/content").status_code == 409


def test_expiry_deletes_the_record_and_the_file(tmp_path):
    http, _ = make_client("video", files_dir=str(tmp_path), file_ttl_s=1.5)  # expires_at is whole seconds: at least 0.5 s away
    with http:
        job = http.post("/v1/videos", data=FORM).json()
        _wait(http, job["id"])
        path = tmp_path / "videos" / f"{job['id']}.mp4"
        assert path.is_file() and len(rows(tmp_path)) == 1
        time.sleep(1.6)
        assert http.get(f"/v1/videos/{job['id']}").status_code == 404
        assert not path.exists() and rows(tmp_path) == []
