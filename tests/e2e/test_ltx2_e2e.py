"""`omnistage serve` on the tiny LTX-2 image-to-video zoo model, driven by the official `openai`
client's videos API: the job animates its `input_reference` image, and its MP4 carries the
soundtrack the model made as an AAC track. (Text-to-video LTX-2 serves through the same route and
muxing, without the image; one server here keeps the suite short.)"""

from __future__ import annotations

import io
import time

import numpy as np
import openai
import pytest
from PIL import Image
from remote_server import RemoteServer

from omnistage.media.video import decode_audio_track, decode_video

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]


def test_ltx2_i2v_video_job_has_an_audio_track(zoo):
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (30, 120, 200)).save(buf, format="PNG")
    image = ("sea.png", buf.getvalue(), "image/png")
    with RemoteServer(zoo("ltx2-i2v"), in_process=True) as server:
        client = server.client()
        # Our fields beyond OpenAI's ride in the multipart form (extra_body); STG on the zoo
        # transformer's last block (it has two).
        video = client.videos.create(
            prompt="waves on a beach", size="64x64", input_reference=image,
            extra_body={"num_frames": "9", "fps": "12", "num_inference_steps": "2", "seed": "5",
                        "extra_params": '{"max_sequence_length": 32, "stg_block": 1}'},
        )
        assert video.status in ("queued", "in_progress"), video
        deadline = time.time() + 120
        while video.status not in ("completed", "failed") and time.time() < deadline:
            time.sleep(0.2)
            video = client.videos.retrieve(video.id)
        assert video.status == "completed", video
        mp4 = client.videos.download_content(video.id).content

        frames, fps = decode_video(mp4)
        assert frames.shape == (9, 64, 64, 3) and fps == 12
        track = decode_audio_track(mp4)
        assert track is not None, "the MP4 has no audio track"
        audio, sample_rate = track
        assert sample_rate == 16000 and audio.shape[0] == 2  # the vocoder's stereo at its rate
        # About as long as the video (AAC pads to whole 1024-sample frames), and not silence.
        assert abs(audio.shape[1] / sample_rate - 9 / 12) < 0.15
        assert np.abs(audio).max() > 1e-3

        # A bad extra is a 400 naming it, on a job (checked before it is queued) and on /v1/videos/sync;
        # so is a job without its image.
        bad = {"num_frames": "9", "extra_params": '{"stg_block": 5}'}
        with pytest.raises(openai.BadRequestError, match="stg_block"):
            client.videos.create(prompt="x", size="64x64", input_reference=image, extra_body=bad)
        resp = server.http().post("/v1/videos/sync", data={"prompt": "x", "size": "64x64", **bad},
                                  files={"input_reference": image})
        assert resp.status_code == 400 and "stg_block" in resp.json()["error"]["message"]
        resp = server.http().post("/v1/videos/sync", data={"prompt": "x", "size": "64x64", "num_frames": "9"})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "input_reference"
