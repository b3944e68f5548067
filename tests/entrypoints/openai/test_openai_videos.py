"""Video jobs and /v1/videos/sync over a fake engine (raw HTTP, as the OpenAI client's
video API targets a hosted model)."""

from __future__ import annotations

import asyncio
import email.parser
import io
import time

import numpy as np
import pytest
from PIL import Image

from omnistage.entrypoints.openai.videos.serving import all_of
from omnistage.media.video import decode_video


def _wait(http, video_id, status="completed", timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = http.get(f"/v1/videos/{video_id}").json()
        if job["status"] == status:
            return job
        time.sleep(0.02)
    raise AssertionError(f"job {video_id} stayed {job['status']}")


def test_job_lifecycle_progress_list_content_delete(app_client):
    http, engine = app_client("video", step_delay=0.05)
    resp = http.post("/v1/videos", data={"prompt": "a wave", "size": "32x16", "num_frames": "9", "fps": "8",
                                         "num_inference_steps": "4", "seed": "1",
                                         "extra_params": '{"max_sequence_length": 32}'})
    assert resp.status_code == 200, resp.text
    job = resp.json()
    assert job["object"] == "video" and job["status"] == "queued" and job["progress"] == 0
    assert job["id"].startswith("video_") and job["size"] == "32x16" and job["model"] == "fake-video"

    seen = set()
    deadline = time.time() + 10
    while time.time() < deadline:
        current = http.get(f"/v1/videos/{job['id']}").json()
        seen.add((current["status"], current["progress"]))
        if current["status"] == "completed":
            break
        time.sleep(0.01)
    assert current["progress"] == 100 and current["num_frames"] == 9 and current["seconds"] == "1.12"
    assert any(status == "in_progress" and 0 < progress < 100 for status, progress in seen)
    _, params, _ = engine.requests[-1]
    assert params.num_frames == 9 and params.extras == {"max_sequence_length": 32} and params.seed == 1

    listed = http.get("/v1/videos").json()
    assert listed["object"] == "list" and [v["id"] for v in listed["data"]] == [job["id"]]

    content = http.get(f"/v1/videos/{job['id']}/content")
    assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
    frames, fps = decode_video(content.content)
    assert frames.shape[:3] == (9, 16, 32) and fps == 8

    deleted = http.delete(f"/v1/videos/{job['id']}").json()
    assert deleted == {"id": job["id"], "object": "video.deleted", "deleted": True}
    assert http.get(f"/v1/videos/{job['id']}").status_code == 404


def test_no_job_is_accepted_while_a_stage_is_down(app_client):
    http, engine = app_client("video")
    form = {"prompt": "a wave", "size": "32x16", "num_frames": "9", "fps": "8", "num_inference_steps": "2"}
    engine.healthy = False  # as while the supervisor restarts the stage
    resp = http.post("/v1/videos", data=form)
    assert resp.status_code == 503 and resp.headers["retry-after"].isdigit(), resp.text
    assert resp.json()["error"]["code"] == "stage_unavailable"
    assert http.get("/v1/videos").json()["data"] == [] and not engine.requests  # nothing queued
    engine.healthy = True
    assert http.post("/v1/videos", data=form).status_code == 200


def test_delete_cancels_a_running_job(app_client):
    http, engine = app_client("video", step_delay=0.5)
    job = http.post("/v1/videos", data={"prompt": "slow"}).json()
    _wait(http, job["id"], "in_progress")
    resp = http.get(f"/v1/videos/{job['id']}/content")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "video_not_ready"
    assert http.delete(f"/v1/videos/{job['id']}").status_code == 200
    assert engine.aborted == [job["id"]]
    assert http.app.state.gateway.num_admitted == 0


def test_sync_returns_mp4_with_frame_count(app_client):
    http, engine = app_client("video")
    resp = http.post("/v1/videos/sync", data={"prompt": "x", "width": "24", "height": "16", "seconds": "1",
                                              "fps": "4"})
    assert resp.status_code == 200 and resp.headers["content-type"] == "video/mp4"
    assert resp.headers["x-num-frames"] == "5"  # 1 s at 4 fps: the first frame plus 4
    frames, _ = decode_video(resp.content)
    assert frames.shape[:3] == (5, 16, 24)

    # multipart with an input reference (a generic pipeline may take one)
    buf = io.BytesIO()
    Image.new("RGB", (24, 16)).save(buf, format="PNG")
    reference = {"input_reference": ("r.png", buf.getvalue(), "image/png")}
    resp = http.post("/v1/videos/sync", data={"prompt": "x"}, files=reference)
    assert resp.status_code == 200
    assert isinstance(engine.requests[-1][0]["image"], Image.Image)


def test_video_form_errors(app_client):
    http, engine = app_client("video")
    cases = [
        ({"prompt": "x", "size": "32x16", "width": "32"}, "size"),
        ({"prompt": "x", "width": "32"}, "height"),
        ({"prompt": "x", "seconds": "2"}, "seconds"),
        ({"prompt": "x", "seconds": "2", "num_frames": "9", "fps": "4"}, "seconds"),
        ({"prompt": "x", "extra_params": "{oops"}, "extra_params"),
        ({"prompt": "x", "extra_params": "[1]"}, "extra_params"),
        ({"prompt": "x", "num_frames": "0"}, "num_frames"),
        ({"prompt": "x", "size": "99999x8"}, "size"),
        ({"size": "32x16"}, "prompt"),
    ]
    for data, param in cases:
        resp = http.post("/v1/videos", data=data)
        assert resp.status_code == 400, (data, resp.text)
        assert resp.json()["error"]["param"] == param, (data, resp.json())
    resp = http.post("/v1/videos", json={"prompt": "x"})
    assert resp.status_code == 415
    assert engine.requests == []
    # What only the engine can check fails the job (sync: a 400), naming the field.
    resp = http.post("/v1/videos/sync", data={"prompt": "x", "extra_params": '{"nope": 1}'})
    assert resp.status_code == 400 and "nope" in resp.json()["error"]["message"]
    job = http.post("/v1/videos", data={"prompt": "x", "extra_params": '{"nope": 1}'}).json()
    job = _wait(http, job["id"], "failed")
    assert "nope" in job["error"]["message"] and job["error"]["code"] == "invalid_request_error"
    assert http.get("/v1/videos/video_missing").status_code == 404


def test_image_model_does_not_serve_videos(app_client):
    http, _ = app_client("image")
    resp = http.post("/v1/videos/sync", data={"prompt": "x"})
    assert resp.status_code == 400 and "/v1/images/generations" in resp.json()["error"]["message"]


def test_a_control_video_is_refused_by_a_model_that_takes_none(app_client):
    from omnistage.media.video import encode_mp4

    http, _ = app_client("video")
    mp4 = encode_mp4(np.zeros((5, 16, 16, 3), np.uint8), 8.0)
    resp = http.post("/v1/videos", data={"prompt": "a wave", "num_frames": "5"},
                     files={"control_video": ("c.mp4", mp4, "video/mp4")})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "control_video"


def _png(color=(0, 0, 0)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (24, 16), color).save(buf, format="PNG")
    return buf.getvalue()


def test_n_videos_a_job_and_a_multipart_sync_answer(app_client):
    http, engine = app_client("video", max_n=3)
    form = {"prompt": "a wave", "size": "32x16", "num_frames": "5", "fps": "8", "seed": "5", "n": "2"}
    job = _wait(http, http.post("/v1/videos", data=form).json()["id"])
    assert job["n"] == 2 and job["progress"] == 100
    # Two engine requests, video i with seed + i (each can be made again alone).
    assert [(rid, p.seed) for _, p, rid in engine.requests] == [(f"{job['id']}_0", 5), (f"{job['id']}_1", 6)]
    for index in (0, 1):
        frames, _ = decode_video(http.get(f"/v1/videos/{job['id']}/content", params={"index": index}).content)
        assert frames.shape[:3] == (5, 16, 32)
    resp = http.get(f"/v1/videos/{job['id']}/content", params={"index": 2})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "index"

    resp = http.post("/v1/videos/sync", data={**form, "n": "3"})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("multipart/mixed")
    message = email.parser.BytesParser().parsebytes(
        b"content-type: " + resp.headers["content-type"].encode() + b"\r\n\r\n" + resp.content)
    parts = message.get_payload()
    assert [p["content-type"] for p in parts] == ["video/mp4"] * 3 and parts[2]["x-num-frames"] == "5"
    assert decode_video(parts[1].get_payload(decode=True))[0].shape[:3] == (5, 16, 32)
    assert [p.seed for _, p, _ in engine.requests[-3:]] == [5, 6, 7]

    resp = http.post("/v1/videos", data={**form, "n": "4"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "n"


def test_input_references_sorted_by_kind_and_refusals_name_the_field(app_client):
    from omnistage.media.video import encode_mp4

    http, engine = app_client("video")
    red, blue = _png((200, 0, 0)), _png((0, 0, 200))
    files = [("input_references", ("a.png", red, "image/png")),
             ("input_references", ("b", blue, "application/octet-stream")),  # no type, no extension
             ]
    resp = http.post("/v1/videos/sync", data={"prompt": "x"}, files=files)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input_references"
    assert "input_references[1]" in resp.json()["error"]["message"]
    # The images, in the order sent (the type may also come from the file name).
    files[1] = ("input_references", ("b.png", blue, "application/octet-stream"))
    assert http.post("/v1/videos/sync", data={"prompt": "x"}, files=files).status_code == 200
    images = engine.requests[-1][0]["image"]
    assert [im.getpixel((0, 0)) for im in images] == [(200, 0, 0), (0, 0, 200)]

    mp4 = encode_mp4(np.zeros((5, 16, 16, 3), np.uint8), 8.0)
    cases = [
        ([("input_references", ("v.wav", b"RIFF", "audio/wav"))], {}, "input_references"),
        ([("input_references", ("c.mp4", mp4, "video/mp4"))], {}, "input_references"),  # takes no video
        ([files[0], ("input_reference", ("r.png", red, "image/png"))], {}, "input_references"),
        ([], {"audio_reference": '{"audio_url": "data:audio/wav;base64,UklGRg=="}'}, "audio_reference"),
        ([], {"aspect_ratio": "16:9", "short_edge": "480"}, "aspect_ratio"),
        ([], {"vae_use_tiling": "true"}, "vae_use_tiling"),
        ([], {"num_outputs_per_prompt": "2"}, "num_outputs_per_prompt"),
    ]
    before = len(engine.requests)
    for upload, fields, param in cases:
        resp = http.post("/v1/videos", data={"prompt": "x", **fields}, files=upload or None)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, (param, resp.text)
    assert len(engine.requests) == before  # refused at admission: nothing queued


def test_deleting_a_job_of_n_videos_aborts_each_and_one_failure_aborts_the_others(app_client):
    http, engine = app_client("video", step_delay=0.5)
    job = http.post("/v1/videos", data={"prompt": "slow", "n": "2"}).json()
    _wait(http, job["id"], "in_progress")
    assert http.delete(f"/v1/videos/{job['id']}").status_code == 200
    assert sorted(engine.aborted) == [f"{job['id']}_0", f"{job['id']}_1"]
    assert http.app.state.gateway.num_admitted == 0

    cancelled = []

    async def slow():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def fails():
        raise ValueError("one video failed")

    with pytest.raises(ValueError):
        asyncio.run(all_of([slow(), fails()]))
    assert cancelled == [True]
