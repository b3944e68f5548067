"""`omnistage serve` on the tiny Wan-VACE zoo model: a video job steered by a control video, its
mask and two reference images (multipart uploads), and the 400 for a control video of the
wrong length."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from remote_server import RemoteServer, finished_video_job

from omnistage.media.video import decode_video, encode_mp4

pytestmark = pytest.mark.e2e


def png(color: tuple[int, int, int], size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def test_wan_vace_job_with_control_video_mask_and_references(zoo):
    frames = np.zeros((5, 32, 64, 3), np.uint8)
    frames[:, :, :, 0] = np.linspace(0, 255, 64, dtype=np.uint8)  # a red ramp
    mask = np.zeros_like(frames)
    mask[:, :, 32:] = 255  # regenerate the right half
    files = [("control_video", ("c.mp4", encode_mp4(frames, 8.0), "video/mp4")),
             ("mask_video", ("m.mp4", encode_mp4(mask, 8.0), "video/mp4")),
             ("input_reference", ("a.png", png((200, 30, 30), (32, 32)), "image/png")),
             ("input_reference", ("b.png", png((30, 30, 200), (48, 32)), "image/png"))]
    form = {"prompt": "a red ramp", "size": "64x32", "num_frames": "5", "fps": "8", "num_inference_steps": "2",
            "seed": "1", "extra_params": '{"conditioning_scale": 0.8}'}
    with RemoteServer(zoo("wan-vace"), in_process=True) as server:
        http = server.http()
        job = finished_video_job(http, http.post("/v1/videos", data=form, files=files).json())
        assert job["status"] == "completed", job
        video, fps = decode_video(http.get(f"/v1/videos/{job['id']}/content").content)
        assert video.shape[:3] == (5, 32, 64) and fps == 8  # the reference images' frames are not in it

        resp = http.post("/v1/videos/sync", data={**form, "num_frames": "9"}, files=files[:1])
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "control_video", resp.text
