"""Full duplex on `omnistage serve` with the zoo's random Moshi (one server for the module):
WS /v1/realtime?duplex=1 and WS /v1/duplex. The client streams audio frame by frame with
no commit and hears the model's audio and text while it is still sending; a bad event gets
an `error` naming the field and the session goes on; a dropped session leaves no request
in the engine (`omnistage_queue_depth` back to 0). The turn-based fallback of `?duplex=1`
on a model without duplex is in test_realtime_e2e.py."""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "e2e"))
from remote_server import RemoteServer  # noqa: E402

from omnistage.entrypoints.openai.realtime import audio_format  # noqa: E402
from omnistage.testing.voice import synthetic_speech  # noqa: E402

pytestmark = pytest.mark.e2e

FRAME = 1920  # 80 ms at 24 kHz


@pytest.fixture(scope="module")
def server(zoo):
    server = RemoteServer(zoo("moshi"), "--served-model-name", "moshi", in_process=True)
    yield server
    assert server.stop() == 0


def queue_depth(server: RemoteServer) -> float:
    text = server.http().get("/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("omnistage_queue_depth ")))


def append(ws, audio: np.ndarray) -> None:
    data = base64.b64encode(audio_format.encode(audio, 24000, "audio/pcm")).decode()
    ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": data}))


def events_until(ws, kind: str, timeout: float = 60) -> list[dict]:
    events = []
    while True:
        events.append(json.loads(ws.recv(timeout=timeout)))
        if events[-1]["type"] == kind:
            return events


def test_speaks_while_the_user_is_still_sending(server):
    voice = synthetic_speech(1.6)
    frames = [voice[i:i + FRAME] for i in range(0, len(voice) - FRAME + 1, FRAME)]  # 20 frames
    with connect(server.url.replace("http", "ws") + "/v1/realtime?model=moshi&duplex=1") as ws:
        created = json.loads(ws.recv(timeout=30))
        assert created["type"] == "session.created"
        caps = created["session"]["capabilities"]
        assert caps["duplex"] is True and caps["supports_client_commit"] is False and caps["chunk_period_ms"] == 80
        assert events_until(ws, "response.created")[-1]["response"]["status"] == "in_progress"
        events, sent_when_audio_came = [], None
        for i, frame in enumerate(frames):
            append(ws, frame)  # no commit: the model hears each frame as it comes
            if i == 5:  # a bad event: an error naming the field, and the session goes on
                ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": 123, "event_id": "bad"}))
            while True:  # what the model has said so far, without waiting for more
                try:
                    events.append(json.loads(ws.recv(timeout=0.05 if i < len(frames) - 1 else 10)))
                except TimeoutError:
                    break
                if events[-1]["type"] == "response.output_audio.delta" and sent_when_audio_came is None:
                    sent_when_audio_came = i + 1
                if i == len(frames) - 1 and sum(e["type"] == "response.output_audio.delta" for e in events) \
                        >= len(frames):
                    break
        errors = [e for e in events if e["type"] == "error"]
        assert len(errors) == 1 and errors[0]["error"]["param"] == "audio" and errors[0]["error"]["event_id"] == "bad"
        assert sent_when_audio_came is not None and sent_when_audio_came < len(frames)  # heard while sending
        audio = [base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"]
        # one 80 ms frame of speech per frame heard
        assert len(audio) == len(frames) and all(len(a) == 2 * FRAME for a in audio)
        assert "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
        ws.send(json.dumps({"type": "session.close"}))
        closing = events_until(ws, "session.closed")
        assert closing[-1]["reason"] == "client_close"
        assert [e["type"] for e in closing][-2:] == ["response.done", "session.closed"]
    deadline = time.time() + 10
    while queue_depth(server) != 0 and time.time() < deadline:
        time.sleep(0.1)
    assert queue_depth(server) == 0


def test_a_dropped_session_frees_the_engine_and_duplex_0_is_refused(server):
    url = server.url.replace("http", "ws")
    with connect(url + "/v1/duplex") as ws:  # the native route: the same session
        assert json.loads(ws.recv(timeout=30))["session"]["capabilities"]["duplex"] is True
        events_until(ws, "response.created")
        append(ws, np.zeros(3 * FRAME, np.float32))
        events_until(ws, "response.output_audio.delta")
        assert queue_depth(server) == 1  # the session's request runs, waiting for more audio
    deadline = time.time() + 10  # the client is gone without a word: its request is aborted
    while queue_depth(server) != 0 and time.time() < deadline:
        time.sleep(0.1)
    assert queue_depth(server) == 0
    with connect(url + "/v1/realtime?duplex=0") as ws:
        error = json.loads(ws.recv(timeout=30))
        assert error["type"] == "error" and error["error"]["param"] == "duplex"
