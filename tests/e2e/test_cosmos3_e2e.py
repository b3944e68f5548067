"""`omnistage serve` on the tiny Cosmos3 zoo model: an image-to-video job through the official
`openai` client (`input_reference`), video-to-video through `control_video`, and the 400s naming
the form field Cosmos3 cannot take (`mask_video`) or cannot take together (`control_video`)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from remote_server import RemoteServer

from omnistage.media.video import decode_video, encode_mp4

# The SDK warns that the hosted Sora API it was written for is being retired.
pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]


def test_cosmos3_image_and_video_to_video(zoo):
    buf = io.BytesIO()
    Image.new("RGB", (64, 32), (30, 200, 30)).save(buf, format="PNG")
    image = ("field.png", buf.getvalue(), "image/png")
    frames = np.zeros((9, 32, 64, 3), np.uint8)
    frames[:, :, :, 0] = np.linspace(0, 255, 64, dtype=np.uint8)  # a red ramp
    clip = ("clip.mp4", encode_mp4(frames, 8.0), "video/mp4")
    form = {"prompt": "a red ramp", "size": "64x32", "num_frames": "9", "fps": "8", "num_inference_steps": "2",
            "seed": "1"}
    with RemoteServer(zoo("cosmos3"), in_process=True) as server:
        client = server.client()
        job = client.videos.create(prompt="a green field", input_reference=image, size="64x32",
                                   extra_body={"num_frames": 5, "fps": 8, "num_inference_steps": 2, "seed": 1})
        job = client.videos.poll(job.id, poll_interval_ms=200)
        assert job.status == "completed", job
        video, fps = decode_video(client.videos.download_content(job.id).read())
        assert video.shape[:3] == (5, 32, 64) and fps == 8

        http = server.http()
        resp = http.post("/v1/videos/sync", data=form, files={"control_video": clip})
        assert resp.status_code == 200, resp.text
        video, _ = decode_video(resp.content)
        assert video.shape[:3] == (9, 32, 64)

        for files, param in (({"control_video": clip, "mask_video": clip}, "mask_video"),
                             ({"control_video": clip, "input_reference": image}, "control_video")):
            resp = http.post("/v1/videos/sync", data=form, files=files)
            assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
