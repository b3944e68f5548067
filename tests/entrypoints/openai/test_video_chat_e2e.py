"""WS /v1/video/chat/stream on the zoo's random Qwen2.5-Omni (one in-process app for the module,
behind an API key): text and audio answers over streamed frames, the frames each query took,
the near-duplicate filter, history across queries, each error event (the session goes on), a
disconnect aborting the running answer, and incremental prefill shown by the thinker's
prefix-cache hits (the engine's `num_cached_tokens`), which are gone with prefill off."""

from __future__ import annotations

import base64
import io
import time
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image
from ws_events import until


KEY = "k3y"
HEADERS = {"Authorization": f"Bearer {KEY}"}
URL = "/v1/video/chat/stream"
TEXT = {"type": "session.config", "modalities": ["text"], "num_frames": 8,
        "sampling_params_list": [{"max_tokens": 6, "temperature": 0}]}
# A random talker rarely emits its end code: cap it, with a floor so the answer has audio.
OVERRIDES = {"1": {"default_sampling_params": {"max_tokens": 24, "min_tokens": 8, "seed": 0}}}


def frame(seed: int, size: int = 56) -> str:
    pixels = (np.random.RandomState(seed).rand(size, size, 3) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def served(zoo):
    from fastapi.testclient import TestClient

    from omnistage import AsyncOmni
    from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

    path = str(zoo("qwen2.5-omni"))
    settings = ServerSettings(served_model_name="omni", model_path=path, api_key=KEY, max_input_pixels=96 * 96)
    engine = AsyncOmni(path, stage_overrides=OVERRIDES)
    with TestClient(create_app(settings, engine)) as client:  # its lifespan shuts the engine down
        # The same engine behind a server that prefills each query's whole prompt (no lifespan: one shutdown).
        off = TestClient(create_app(replace(settings, video_chat_prefill=False), engine))
        yield client, off


@contextmanager
def connect(client):
    with client.websocket_connect(URL, headers=HEADERS) as ws:
        assert ws.receive_json()["type"] == "session.created"
        yield ws



def configure(ws, config: dict) -> dict:
    ws.send_json(config)
    return until(ws, "session.updated")[-1]["session"]


def send_frames(ws, seeds: list[int], wait_prefill: bool) -> None:
    for i, seed in enumerate(seeds):
        ws.send_json({"type": "video.frame", "image": frame(seed), "frame_id": f"f{seed}", "pts_ms": 500 * i})
    if wait_prefill:  # the warm-up that covers the last frame
        while f"f{seeds[-1]}" not in until(ws, "video.frames.prefilled")[-1]["frame_ids"]:
            pass


def ask(ws, text: str) -> tuple[dict, list[dict]]:
    ws.send_json({"type": "video.query", "text": text})
    events = until(ws, "response.done")
    return events[-1]["response"], events


def test_text_answers_see_the_frames_and_the_history(served):
    client, _ = served
    with connect(client) as ws:
        configure(ws, TEXT)
        # Frame 11 twice: the filter drops the repeat, so the query takes three frames.
        for seed, frame_id in ((10, "a"), (11, "b"), (11, "b-again"), (12, "c")):
            ws.send_json({"type": "video.frame", "image": frame(seed), "frame_id": frame_id, "pts_ms": seed * 100})
        first, events = ask(ws, "What do you see?")
        consumed = next(e for e in events if e["type"] == "video.frames.consumed")
        assert consumed["frame_ids"] == ["a", "b", "c"] and consumed["frames"] == 3
        assert consumed["latest_pts_ms"] == 1200
        kinds = [e["type"] for e in events]
        assert kinds.index("video.frames.consumed") < kinds.index("response.created") < kinds.index("response.done")
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert first["status"] == "incomplete" and text and first["output_text"] == text
        # The second query reads the first one's frames, question and answer: its prompt holds them
        # all, and the thinker's prefix cache already had the first prompt.
        second, events = ask(ws, "And now?")
        assert not any(e["type"] == "video.frames.consumed" and e["frames"] for e in events)
        usage, before = second["usage"], first["usage"]
        assert usage["input_tokens"] > before["input_tokens"] + before["output_tokens"]
        assert usage["input_token_details"]["cached_tokens"] >= 16
        # With the filter off, an equal frame is kept.
        configure(ws, {"type": "session.config", "enable_frame_filter": False})
        for frame_id in ("d", "d-again"):
            ws.send_json({"type": "video.frame", "image": frame(13), "frame_id": frame_id})
        _, events = ask(ws, "Twice?")
        assert next(e for e in events if e["type"] == "video.frames.consumed")["frame_ids"] == ["d", "d-again"]


@pytest.mark.parametrize("prefill", [True, False])
def test_incremental_prefill_makes_the_first_query_a_cache_hit(served, prefill):
    client, off = served
    with connect(client if prefill else off) as ws:
        configure(ws, TEXT)
        seeds = [100 + 10 * prefill + i for i in range(6)]  # frames no other session sent: no hits from elsewhere
        send_frames(ws, seeds, wait_prefill=prefill)
        done, _ = ask(ws, "What happens?")
        cached = done["usage"]["input_token_details"]["cached_tokens"]
        # The prompt is 3 header tokens, then six frames of 6 tokens (4 vision tokens at 56 x 56
        # between their bos and eos), then the question: the thinker's blocks are 16 tokens, so
        # the two full blocks of frames are cached and the query computes from token 32 on.
        if prefill:
            assert cached == 32, done["usage"]
        else:
            assert cached == 0, done["usage"]


def test_audio_answer_streams_pcm(served):
    client, _ = served
    with connect(client) as ws:
        session = configure(ws, {**TEXT, "modalities": ["text", "audio"], "num_frames": 16})
        assert session["modalities"] == ["text", "audio"]
        send_frames(ws, list(range(200, 212)), wait_prefill=True)  # 12 frames: a 79-token warm-up
        done, events = ask(ws, "Say it.")
        audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
        transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
        assert len(audio) > 0 and len(audio) % 2 == 0 and transcript == done["output_text"]
        assert not any(e["type"] == "response.output_text.delta" for e in events)
        # The warm-ups of a spoken session keep the talker's rows with their blocks, so the spoken
        # query reuses them: 3 header tokens and 12 frames of 6 tokens fill four 16-token blocks.
        assert done["usage"]["input_token_details"]["cached_tokens"] == 64, done["usage"]


def test_bad_events_are_error_events_and_the_session_goes_on(served):
    client, _ = served
    with connect(client) as ws:
        configure(ws, {**TEXT, "max_frames": 2})

        def error(event: dict) -> dict:
            ws.send_json(event)
            got = ws.receive_json()
            while got["type"] == "video.frames.prefilled":  # warm-ups of the frames sent end in between
                got = ws.receive_json()
            assert got["type"] == "error", got
            return got["error"]

        assert error({"type": "session.config", "num_frames": 0})["param"] == "num_frames"
        assert error({"type": "session.config", "modalities": ["audio"]})["param"] == "modalities"
        assert error({"type": "session.config", "sampling_params_list": [{"temperature": -1}]})["param"] == \
            "sampling_params_list[0].temperature"
        assert error({"type": "video.seek"})["param"] == "type"
        bad = error({"type": "video.frame", "image": base64.b64encode(b"not an image").decode(), "event_id": "e1"})
        assert (bad["param"], bad["code"], bad["event_id"]) == ("image", "invalid_image", "e1")
        big = error({"type": "video.frame", "image": frame(1, size=128)})  # over --max-input-pixels (96 x 96)
        assert (big["param"], big["code"]) == ("image", "image_too_large")
        assert error({"type": "video.query"})["param"] == "text"
        send_frames(ws, [300, 301], wait_prefill=False)
        full = error({"type": "video.frame", "image": frame(302)})
        assert (full["param"], full["code"]) == ("max_frames", "frame_buffer_full")
        done, events = ask(ws, "Still there?")  # the session goes on
        assert next(e for e in events if e["type"] == "video.frames.consumed")["frame_ids"] == ["f300", "f301"]
        assert done["status"] in ("completed", "incomplete")


def test_disconnect_aborts_the_running_answer(served):
    client, _ = served
    gateway = client.app.state.gateway
    with connect(client) as ws:
        configure(ws, {**TEXT, "sampling_params_list": [{"max_tokens": 4000, "ignore_eos": True}]})
        send_frames(ws, [400], wait_prefill=False)
        ws.send_json({"type": "video.query", "text": "Talk for a long time."})
        until(ws, "response.output_text.delta")
    deadline = time.time() + 10
    while gateway.num_admitted and time.time() < deadline:
        time.sleep(0.05)
    assert gateway.num_admitted == 0  # aborted: 4000 tokens would take far longer


def test_the_api_key_is_checked_on_the_upgrade(served):
    from starlette.websockets import WebSocketDisconnect

    client, _ = served
    with pytest.raises(WebSocketDisconnect) as e:
        with client.websocket_connect(URL) as ws:
            ws.receive_json()
    assert e.value.code == 1008


def test_serve_flag_turns_incremental_prefill_off():
    from omnistage.entrypoints.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve", "m"]).video_chat_prefill is True
    assert parser.parse_args(["serve", "m", "--no-video-chat-prefill"]).video_chat_prefill is False
