"""`omnistage serve` on the tiny Wan-VACE zoo model (one in-process server for the module): a video
job steered by a control video, its mask and two reference images (multipart uploads), and the
400 for a control video of the wrong length. The videos API's repeated `input_references` (the
reference images and the control video, told apart by their types) steer it as the dedicated
fields do, and a refusal names `input_references`; `n` makes n videos, video i being what
`seed + i` alone makes."""

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


FORM = {"prompt": "a red ramp", "size": "64x32", "num_frames": "5", "fps": "8", "num_inference_steps": "2",
        "seed": "1"}


@pytest.fixture(scope="module")
def http(zoo):
    with RemoteServer(zoo("wan-vace"), in_process=True) as server:
        yield server.http()


def control(num_frames: int = 5) -> bytes:
    frames = np.zeros((num_frames, 32, 64, 3), np.uint8)
    frames[:, :, :, 0] = np.linspace(0, 255, 64, dtype=np.uint8)  # a red ramp
    return encode_mp4(frames, 8.0)


def test_wan_vace_job_with_control_video_mask_and_references(http):
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
    job = finished_video_job(http, http.post("/v1/videos", data=form, files=files).json())
    assert job["status"] == "completed", job
    video, fps = decode_video(http.get(f"/v1/videos/{job['id']}/content").content)
    assert video.shape[:3] == (5, 32, 64) and fps == 8  # the reference images' frames are not in it

    resp = http.post("/v1/videos/sync", data={**form, "num_frames": "9"}, files=files[:1])
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "control_video", resp.text


def test_input_references_carry_reference_images_and_the_control_video(http):
    a, b, clip = png((200, 30, 30), (32, 32)), png((30, 30, 200), (32, 32)), control()
    # The same inputs in the dedicated fields and as one repeated field (video first: kinds keep their own order).
    separate = http.post("/v1/videos/sync", data=FORM, files=[
        ("input_reference", ("a.png", a, "image/png")), ("input_reference", ("b.png", b, "image/png")),
        ("control_video", ("c.mp4", clip, "video/mp4"))])
    together = http.post("/v1/videos/sync", data=FORM, files=[
        ("input_references", ("c.mp4", clip, "video/mp4")), ("input_references", ("a.png", a, "image/png")),
        ("input_references", ("b.png", b, "image/png"))])
    assert separate.status_code == together.status_code == 200, (separate.text, together.text)
    video, _ = decode_video(together.content)
    assert video.shape[:3] == (5, 32, 64)
    assert np.array_equal(video, decode_video(separate.content)[0])
    swapped = http.post("/v1/videos/sync", data=FORM, files=[
        ("input_references", ("c.mp4", clip, "video/mp4")), ("input_references", ("b.png", b, "image/png")),
        ("input_references", ("a.png", a, "image/png"))])
    assert not np.array_equal(video, decode_video(swapped.content)[0])  # the images, in order, reach the model

    # The engine refuses a control video of 9 frames for 5: the 400 names the field it came in.
    resp = http.post("/v1/videos", data=FORM, files=[("input_references", ("c.mp4", control(9), "video/mp4"))])
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input_references", resp.text


def test_n_videos_are_the_videos_of_seed_plus_i(http):
    job = finished_video_job(http, http.post("/v1/videos", data={**FORM, "n": "2"}).json())
    assert job["status"] == "completed" and job["n"] == 2, job
    videos = [decode_video(http.get(f"/v1/videos/{job['id']}/content", params={"index": i}).content)[0]
              for i in range(2)]
    assert not np.array_equal(videos[0], videos[1])
    second = http.post("/v1/videos/sync", data={**FORM, "seed": "2"})
    assert np.array_equal(videos[1], decode_video(second.content)[0])
