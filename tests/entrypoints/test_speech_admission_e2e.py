"""Admission by real-time budget on `omnistage serve` with the tiny CSM (served from the test process):
with the codec stage's `audio_capacity` forced to 1.5 audio seconds per wall second, one stream fits
and a second waits in the queue until the first ends; past `--max-queued-requests 2` the third gets
429 with Retry-After. Without the admission the second would start at once beside the first."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from remote_server import RemoteServer  # noqa: E402

pytestmark = pytest.mark.e2e

OVERRIDES = {"0": {"default_sampling_params": {"temperature": 0, "ignore_eos": True}}, "1": {"real_time_admission": True, "audio_capacity": 1.5},
             "*": {"max_num_seqs": 4}}
SPEECH = {"model": "csm", "voice": "alloy", "input": "Hello there.", "response_format": "pcm", "stream_format": "audio"}


@pytest.fixture(scope="module")
def server(zoo):
    server = RemoteServer(zoo("csm"), "--served-model-name", "csm", "--stage-overrides", json.dumps(OVERRIDES),
                          "--max-queued-requests", "2", in_process=True)
    yield server
    assert server.stop() == 0


def metric(server: RemoteServer, name: str) -> float | None:
    found = re.search(rf'^{name}{{pipeline="csm"}} (\S+)$', httpx.get(f"{server.url}/metrics").text, re.M)
    return None if found is None else float(found.group(1))


def wait_for(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_a_stream_past_the_capacity_waits_and_one_past_max_queued_is_refused(server):
    first_audio: dict[str, float] = {}
    num_bytes: dict[str, int] = {}
    stop_long = threading.Event()

    def stream(name: str, frames: int) -> None:
        with server.http() as http, http.stream("POST", "/v1/audio/speech",
                                                json={**SPEECH, "max_new_tokens": frames}) as resp:
            assert resp.status_code == 200
            for piece in resp.iter_bytes():
                first_audio.setdefault(name, time.monotonic())
                num_bytes[name] = num_bytes.get(name, 0) + len(piece)
                if name == "long" and stop_long.is_set():
                    return  # the client goes away: the server aborts the request

    long = threading.Thread(target=stream, args=("long", 750))  # 60 s of audio, far more than the test lasts
    long.start()
    assert wait_for(lambda: "long" in first_audio)
    short = threading.Thread(target=stream, args=("short", 10))
    short.start()
    assert wait_for(lambda: metric(server, "omnistage_audio_requests_waiting") == 1.0)
    assert "short" not in first_audio and long.is_alive()  # the long stream is still being made: short waits

    with server.http() as http:
        refused = http.post("/v1/audio/speech", json={**SPEECH, "max_new_tokens": 10})
    assert refused.status_code == 429 and refused.headers["retry-after"]
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"

    stop_long.set()  # the long stream ends (its client leaves): the queued one starts
    long.join(30)
    short.join(30)
    assert num_bytes["short"] == 2 * 10 * 1920 and first_audio["short"] > first_audio["long"]
    assert metric(server, "omnistage_audio_requests_waiting") == 0.0
    assert metric(server, "omnistage_audio_requests_queued_total") == 1.0
    assert metric(server, "omnistage_audio_capacity") == 1.5
