"""kill -9 a stage's worker mid-request on a real server (after the panic request of
test_openai_request_bounds.py has been refused by it): the request answers 503 with
Retry-After in OpenAI's body, /health turns 503, requests meanwhile get 503 (never 500),
and the stage comes back by itself: /health 200 and new requests succeed.

The server runs in a thread of the test process (`in_process=True`): what is killed is the
stage's worker, a child process the server spawned, never the server itself."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import signal
import threading
import time

import httpx
import psutil
import pytest
from PIL import Image
from remote_server import RemoteServer

pytestmark = pytest.mark.e2e


def spawned_children() -> set[int]:
    """This process's stage and worker processes (titled "omni:..."), not multiprocessing's helpers."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.name().startswith("omni:") and child.status() != psutil.STATUS_ZOMBIE:
                found.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def wait_status(http: httpx.Client, path: str, status: int, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if http.get(path).status_code == status:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"{path} did not answer {status} within {timeout} s")


@pytest.mark.parametrize("overrides", [{"0": {"executor": "mp"}}, {"0": {"runtime": "process"}}],
                         ids=["executor-mp", "runtime-process"])
def test_kill_9_mid_request_then_the_stage_serves_again(zoo, overrides, monkeypatch, caplog):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # tiny model, shared 2-core machine: see test_load_e2e.py
    caplog.set_level(logging.WARNING, logger="omnistage")
    before = spawned_children()  # e.g. a rank pair another test file of this worker left running
    with RemoteServer(zoo("z-image"), "--stage-overrides", json.dumps(overrides), in_process=True) as server:
        http = server.http(timeout=120)
        [victim] = spawned_children() - before
        # First the panic request (a max_sequence_length of 2**62 once panicked the tokenizer in the
        # stage's own process): a 400 naming the field, and the stage keeps serving.
        cheap = {"prompt": "a cat", "size": "32x32", "num_inference_steps": 1}
        resp = http.post("/v1/images/generations", json={**cheap, "max_sequence_length": 2**62})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "max_sequence_length", resp.text
        assert http.get("/health").status_code == 200
        assert http.post("/v1/images/generations", json=cheap).status_code == 200
        assert spawned_children() - before == {victim}
        answer = {}
        slow = threading.Thread(target=lambda: answer.update(resp=http.post("/v1/images/generations", json={
            "prompt": "slow", "size": "64x64", "num_inference_steps": 1000})))
        slow.start()
        deadline = time.time() + 30
        while "omnistage_queue_depth 1.0" not in http.get("/metrics").text:
            assert time.time() < deadline, "the request never started"
            time.sleep(0.05)
        time.sleep(0.5)  # into the denoising loop
        os.kill(victim, signal.SIGKILL)
        slow.join(60)
        resp = answer["resp"]
        assert resp.status_code == 503, resp.text
        assert resp.headers["retry-after"].isdigit()
        assert resp.json()["error"]["type"] == "service_unavailable_error"

        # While it restarts: /health 503, and requests 503 + Retry-After, never 500.
        if http.get("/health").status_code == 503:
            during = http.post("/v1/images/generations", json={"prompt": "x", "size": "64x64",
                                                                "num_inference_steps": 2})
            assert during.status_code in (200, 503), during.text  # 200 if it came back meanwhile
            if during.status_code == 503:
                assert during.headers["retry-after"].isdigit()
        wait_status(http, "/health", 200, timeout=120)
        assert victim not in spawned_children()

        resp = http.post("/v1/images/generations", json={"prompt": "after", "size": "64x32",
                                                          "num_inference_steps": 2})
        assert resp.status_code == 200, resp.text
        image = Image.open(io.BytesIO(base64.b64decode(resp.json()["data"][0]["b64_json"])))
        assert image.size == (64, 32)
        assert "restart attempt 1" in caplog.text
