"""`omnistage serve` on the tiny HunyuanVideo-1.5 zoo models (text- and image-to-video), driven by
the official `openai` client's video API (create, poll, download, delete) and raw HTTP for the
400 cases."""

from __future__ import annotations

import io

import pytest
from PIL import Image
from remote_server import RemoteServer

from omnistage.media.video import decode_video

# The SDK warns that the hosted Sora API it was written for is being retired.
pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]


def test_hunyuan_video_job_through_the_openai_client(zoo):
    with RemoteServer(zoo("hunyuan-video"), in_process=True) as server:
        client = server.client()
        extra = {"num_frames": 5, "fps": 8, "num_inference_steps": 2, "seed": 1}
        job = client.videos.create(prompt='a neon sign that says "open"', size="64x32", extra_body=extra)
        assert job.object == "video" and job.status in ("queued", "in_progress")
        job = client.videos.poll(job.id, poll_interval_ms=200)
        assert job.status == "completed", job
        assert job.size == "64x32"
        frames, fps = decode_video(client.videos.download_content(job.id).read())
        assert frames.shape[:3] == (5, 32, 64) and fps == 8
        assert client.videos.delete(job.id).deleted is True

        # HunyuanVideo-1.5's VAE folds 4 frames into one latent frame: 4k+1 frames only.
        resp = server.http().post("/v1/videos/sync", data={"prompt": "x", "num_frames": "6"})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "num_frames"


def test_hunyuan_video_i2v_job_takes_the_image_aspect_ratio(zoo):
    buf = io.BytesIO()
    Image.new("RGB", (64, 32), (200, 30, 30)).save(buf, format="PNG")
    with RemoteServer(zoo("hunyuan-video-i2v"), in_process=True) as server:
        client = server.client()
        job = client.videos.create(prompt="a red wall", input_reference=("wall.png", buf.getvalue(), "image/png"),
                                   extra_body={"num_frames": 5, "fps": 8, "num_inference_steps": 2, "seed": 1})
        job = client.videos.poll(job.id, poll_interval_ms=200)
        assert job.status == "completed", job
        # A 2:1 image at the tiny model's target size (64) gets the closest bucket, 80x48.
        assert job.size == "80x48"
        frames, _ = decode_video(client.videos.download_content(job.id).read())
        assert frames.shape[:3] == (5, 48, 80)

        resp = server.http().post("/v1/videos/sync", data={"prompt": "x", "size": "64x64"},
                                  files={"input_reference": ("wall.png", buf.getvalue(), "image/png")})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "height"
