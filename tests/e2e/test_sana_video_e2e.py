"""`omnistage serve` on the tiny SANA-Video image-to-video zoo model, driven by the official
`openai` client's video API (create with an uploaded image, poll, download) and raw HTTP for a
400 naming the family's own extra."""

from __future__ import annotations

import io

import pytest
from PIL import Image
from remote_server import RemoteServer

from omnistage.media.video import decode_video

# The SDK warns that the hosted Sora API it was written for is being retired.
pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]


def test_sana_video_i2v_job_through_the_openai_client(zoo):
    buf = io.BytesIO()
    Image.new("RGB", (64, 32), (30, 200, 30)).save(buf, format="PNG")
    image = ("field.png", buf.getvalue(), "image/png")
    with RemoteServer(zoo("sana-video-i2v"), in_process=True) as server:
        client = server.client()
        job = client.videos.create(prompt="a green field", input_reference=image, size="64x32",
                                   extra_body={"num_frames": 5, "fps": 8, "num_inference_steps": 2, "seed": 1})
        job = client.videos.poll(job.id, poll_interval_ms=200)
        assert job.status == "completed", job
        assert job.size == "64x32"
        frames, fps = decode_video(client.videos.download_content(job.id).read())
        assert frames.shape[:3] == (5, 32, 64) and fps == 8

        # The tiny checkpoint has no resolution bins to snap to.
        resp = server.http().post("/v1/videos/sync", data={"prompt": "x", "size": "64x32", "num_frames": "5",
                                                           "use_resolution_binning": "true"},
                                  files={"input_reference": image})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "use_resolution_binning"
