"""`omnistage serve` on the tiny SANA-WM zoo model: a video from an uploaded first frame and a
camera path in `extra_params`, and the 400s naming the camera extra that is missing or wrong."""

from __future__ import annotations

import io
import json

import pytest
from PIL import Image
from remote_server import RemoteServer

from omnistage.media.video import decode_video

pytestmark = pytest.mark.e2e


def test_sana_wm_video_from_an_image_and_a_camera_path(zoo):
    buf = io.BytesIO()
    Image.new("RGB", (96, 64), (30, 200, 30)).save(buf, format="PNG")
    files = {"input_reference": ("field.png", buf.getvalue(), "image/png")}
    camera = {"action": "w-4,jw-4", "intrinsics": [60.0, 60.0, 48.0, 32.0]}
    form = {"prompt": "a green field", "size": "64x32", "num_frames": "9", "fps": "8", "num_inference_steps": "2",
            "seed": "1"}
    with RemoteServer(zoo("sana-wm"), in_process=True) as server:
        http = server.http()
        resp = http.post("/v1/videos/sync", data={**form, "extra_params": json.dumps(camera)}, files=files)
        assert resp.status_code == 200, resp.text
        video, fps = decode_video(resp.content)
        assert video.shape[:3] == (9, 32, 64) and fps == 8

        for extras, param in (({"intrinsics": camera["intrinsics"]}, "action"),
                              ({"action": "w-8"}, "intrinsics"),
                              ({**camera, "action": "w-2"}, "num_frames")):  # 3 poses for 9 frames
            resp = http.post("/v1/videos/sync", data={**form, "extra_params": json.dumps(extras)}, files=files)
            assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
