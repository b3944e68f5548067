"""WS /v1/video/chat/stream on the other omni family: the zoo's random Qwen3-Omni (one in-process
app): a text answer whose prompt the frames' warm-ups put in the thinker's prefix cache, then a
spoken answer (talker, code predictor, code2wav) to a question about more frames."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

URL = "/v1/video/chat/stream"
# Floors too: a random talker may end at once, leaving an answer with no audio (flaky without).
OVERRIDES = {"1": {"default_sampling_params": {"max_tokens": 16, "min_tokens": 8, "seed": 0}}}


def frame(seed: int, size: int = 64) -> str:
    pixels = (np.random.RandomState(seed).rand(size, size, 3) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def until(ws, kind: str) -> list[dict]:
    events = []
    while True:
        events.append(ws.receive_json())
        assert events[-1]["type"] != "error", events[-1]
        if events[-1]["type"] == kind:
            return events


@pytest.fixture(scope="module")
def client(zoo):
    from fastapi.testclient import TestClient

    from omnistage import AsyncOmni
    from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

    path = str(zoo("qwen3-omni"))
    engine = AsyncOmni(path, stage_overrides=OVERRIDES)
    with TestClient(create_app(ServerSettings(served_model_name="omni3", model_path=path), engine)) as client:
        yield client


def test_text_then_spoken_answers_over_streamed_frames(client):
    with client.websocket_connect(URL) as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_json({"type": "session.config", "modalities": ["text"], "num_frames": 8,
                      "sampling_params_list": [{"max_tokens": 4, "temperature": 0}]})
        until(ws, "session.updated")
        for i in range(6):
            ws.send_json({"type": "video.frame", "image": frame(300 + i), "frame_id": f"f{i}"})
        while "f5" not in until(ws, "video.frames.prefilled")[-1]["frame_ids"]:
            pass
        ws.send_json({"type": "video.query", "text": "What happens?"})
        done = until(ws, "response.done")[-1]["response"]
        assert done["status"] in ("completed", "incomplete") and done["output_text"]
        assert done["usage"]["input_token_details"]["cached_tokens"] >= 16  # the warm-ups' blocks
        ws.send_json({"type": "session.config", "modalities": ["text", "audio"]})
        until(ws, "session.updated")
        ws.send_json({"type": "video.frame", "image": frame(310), "frame_id": "g"})
        ws.send_json({"type": "video.query", "text": "Say it."})
        events = until(ws, "response.done")
        audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
        assert events[-1]["response"]["status"] in ("completed", "incomplete")
        assert len(audio) > 0 and len(audio) % 2 == 0
