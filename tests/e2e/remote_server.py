"""`RemoteServer`: `omnistage serve` in a subprocess on a free port, with official clients.

Like vLLM's RemoteOpenAIServer: start, wait for /health, hand out `openai` and `httpx`
clients, stop with a signal and report the exit code. The server's log goes to a file
whose tail is shown when it fails to start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai


def finished_video_job(http: httpx.Client, job: dict, timeout: float = 120.0) -> dict:
    """Poll a just-created /v1/videos job until it completes or fails (or `timeout` passes); its last state."""
    assert job["status"] in ("queued", "in_progress"), job
    deadline = time.time() + timeout
    while job["status"] not in ("completed", "failed") and time.time() < deadline:
        time.sleep(0.2)
        job = http.get(f"/v1/videos/{job['id']}").json()
    return job


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RemoteServer:
    def __init__(self, model: str | Path, *args: str, api_key: str | None = None, startup_timeout: float = 240.0):
        self.port = free_port()
        self.api_key = api_key
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="omnistage-serve-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "omnistage.entrypoints.cli", "serve", str(model), "--port", str(self.port),
               "--log-level", "warning", *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        self._wait_healthy(startup_timeout)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop(signal.SIGKILL)
        raise TimeoutError(f"the server was not healthy after {timeout} s:\n{self.output()[-4000:]}")

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key or "none", max_retries=0,
                             timeout=kwargs.pop("timeout", 300), **kwargs)

    def http(self, **kwargs) -> httpx.Client:
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=kwargs.pop("timeout", 300), **kwargs)

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60.0) -> int:
        """Signal the server and wait for it; returns its exit code (SIGKILL after `timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def __enter__(self) -> RemoteServer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
        os.unlink(self.log.name)
