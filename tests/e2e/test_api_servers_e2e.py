"""`omnistage serve --api-server-count 2`: two API server processes over one engine process.

One server (the zoo's tiny Z-Image) for the whole file: both processes answer, answers are
whole, /metrics brings the engine's stage metrics, sleep state is the engine's, a client
that leaves a stream aborts its engine request, and a killed API server process loses
nothing but its own connections (its engine request is aborted)."""

from __future__ import annotations

import base64
import io
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from PIL import Image
from remote_server import RemoteServer

pytestmark = pytest.mark.e2e

HEADER = "x-omnistage-api-server"
LONG_CHAT = {"messages": [{"role": "user", "content": "a cat"}], "stream": True, "size": "64x64",
             "num_inference_steps": 1000}  # half a minute on the 2-core machine: only an abort ends it soon


@pytest.fixture(scope="module")
def server(zoo, tmp_path_factory):
    # --output-dir: the last test SIGKILLs the engine process, which would leave its temporary folder behind.
    with RemoteServer(zoo("z-image"), "--api-server-count", "2", "--no-restart",
                      "--output-dir", str(tmp_path_factory.mktemp("api-servers"))) as server:
        yield server


def aborted(http: httpx.Client) -> float:
    """The engine's count of requests that ended by an abort (from the engine process)."""
    found = re.search(r'^omnistage_requests_total\{[^}]*status="abort"[^}]*\} (\S+)$', http.get("/metrics").text,
                      re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_two_processes_answer_concurrent_requests(server):
    def generate(_: int) -> httpx.Response:
        with httpx.Client(base_url=server.url, timeout=120) as http:  # a connection of its own
            return http.post("/v1/images/generations", json={"prompt": "x", "size": "64x64",
                                                             "num_inference_steps": 1})

    pids = set()
    with ThreadPoolExecutor(8) as pool:
        for _ in range(3):  # the kernel picks the process; two rounds nearly always reach both
            for resp in pool.map(generate, range(8)):
                assert resp.status_code == 200, resp.text
                image = Image.open(io.BytesIO(base64.b64decode(resp.json()["data"][0]["b64_json"])))
                assert image.size == (64, 64)
                pids.add(int(resp.headers[HEADER]))
            if len(pids) == 2:
                break
    assert len(pids) == 2, pids
    assert os.getpid() not in pids and server.proc.pid not in pids  # neither is the engine's process
    http = server.http()
    metrics = http.get("/metrics").text
    assert 'omnistage_stage_steps_total{pipeline=' in metrics  # the engine's, fetched from its process
    assert "omnistage_http_requests_total" in metrics  # this API server's own


def test_a_streamed_chat_arrives_whole(server):
    with server.http() as http, http.stream("POST", "/v1/chat/completions", json={
            **LONG_CHAT, "num_inference_steps": 2}) as resp:
        assert resp.status_code == 200 and HEADER in resp.headers
        events = [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert '"image_url"' in "".join(events)  # the image, encoded in the API server process


def test_sleep_state_is_the_engines(server):
    with ThreadPoolExecutor(6) as pool:
        def state(_: int) -> tuple[int, bool]:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                resp = http.get("/v1/omni/is_sleeping")
                return int(resp.headers[HEADER]), resp.json()["is_sleeping"]

        with server.http() as http:
            assert http.post("/v1/omni/sleep", json={"level": 1}).json()["is_sleeping"] is True
            answers = list(pool.map(state, range(6)))
            refused = http.post("/v1/images/generations", json={"prompt": "x", "size": "64x64"})
            assert refused.status_code == 503, refused.text
            assert http.post("/v1/omni/wakeup").json()["is_sleeping"] is False
    assert all(sleeping for _, sleeping in answers), answers


def test_update_weights_goes_to_the_engine(server, zoo):
    with server.http() as http:
        resp = http.post("/v1/omni/update_weights", json={"stage": "diffusion", "path": str(zoo("z-image"))})
        assert resp.status_code == 200, resp.text
        assert resp.json()["stage"] == "diffusion" and resp.json()["num_tensors"] > 0
        bad = http.post("/v1/omni/update_weights", json={"stage": "nope", "path": str(zoo("z-image"))})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "stage", bad.text  # typed, across processes


def test_leaving_a_stream_aborts_the_engine_request(server):
    http = server.http()
    before = aborted(http)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json=LONG_CHAT) as resp:
            assert resp.status_code == 200
            assert next(resp.iter_lines()).startswith("data: ")
    wait_for(lambda: aborted(http) > before, 15, "the engine request ran on after its client left")


def test_a_killed_api_server_loses_only_its_own_connections(server):
    http = server.http()
    before = aborted(http)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json=LONG_CHAT) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
            victim = int(resp.headers[HEADER])
            os.kill(victim, signal.SIGKILL)
            with pytest.raises(httpx.HTTPError):  # cut mid-stream
                for _ in lines:
                    pass
    # The engine drops what the dead process held, and the other one serves. A new client: the
    # first one's kept-alive connection may have been the victim's.
    http = server.http()
    wait_for(lambda: aborted(http) > before, 15, "the dead API server's engine request ran on")
    with ThreadPoolExecutor(4) as pool:
        def generate(_: int) -> httpx.Response:
            with httpx.Client(base_url=server.url, timeout=60) as c:  # a connection of its own
                return c.post("/v1/images/generations", json={"prompt": "x", "size": "64x64",
                                                              "num_inference_steps": 1})

        answers = list(pool.map(generate, range(4)))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert victim not in {int(a.headers[HEADER]) for a in answers}
    # Rebuilding a dead API server process (the Supervisor, as for a stage) is tested in
    # tests/runtime/test_service.py; this server runs with --no-restart to skip a fresh
    # interpreter's start-up here.


def test_a_bad_count_is_refused_naming_the_field(capsys):
    from omnistage.entrypoints.cli import main

    assert main(["serve", "some-model", "--api-server-count", "0"]) == 2
    assert "api_server_count must be >= 1, got 0" in capsys.readouterr().err


def test_a_dead_engine_process_takes_the_api_servers_down(server):
    """Last: it ends the file's server. The API servers see the engine's pipe close and exit
    (instead of holding the port with nothing behind it)."""
    import psutil

    with httpx.Client(base_url=server.url, timeout=60) as client:
        survivors = {int(client.get("/health").headers[HEADER])}
    os.kill(server.proc.pid, signal.SIGKILL)
    wait_for(lambda: not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                             for pid in survivors), 30, "an API server outlived the engine process")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health", timeout=5)
