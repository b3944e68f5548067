"""`RemoteServer`: `omnistage serve` in a subprocess on a free port, with official clients.

Like vLLM's RemoteOpenAIServer: start, wait for /health, hand out `openai` and `httpx`
clients, stop with a signal and report the exit code. The server's log goes to a file
whose tail is shown when it fails to start.

`in_process=True` serves the same app (`omnistage serve`'s own `build`, from the same
arguments) from a thread of the test process instead: it skips a fresh interpreter's imports
(several seconds a server on the 2-core machine). For tests that need no process of their
own: not for signals, kills, restarts or the server's log.
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
    def __init__(self, model: str | Path, *args: str, api_key: str | None = None, startup_timeout: float = 240.0,
                 in_process: bool = False):
        self.port = free_port()
        self.api_key = api_key
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="omnistage-serve-", suffix=".log", delete=False)
        argv = ["serve", str(model), "--port", str(self.port), "--log-level", "warning", *args]
        if api_key:
            argv += ["--api-key", api_key]
        self.proc = self.in_process = None
        if in_process:
            self.in_process = _InProcess(argv)
        else:
            self.proc = subprocess.Popen([sys.executable, "-m", "omnistage.entrypoints.cli", *argv], stdout=self.log,
                                         stderr=subprocess.STDOUT, text=True)
        self._wait_healthy(startup_timeout)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.in_process is not None and not self.in_process.thread.is_alive():
                raise RuntimeError(f"the in-process server stopped: {self.in_process.error!r}")
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop(signal.SIGKILL)
        raise TimeoutError(f"the server was not healthy after {timeout} s:\n{self.output()[-4000:]}")

    def is_running(self) -> bool:
        if self.in_process is not None:
            return self.in_process.thread.is_alive()
        return self.proc.poll() is None

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key or "none", max_retries=0,
                             timeout=kwargs.pop("timeout", 300), **kwargs)

    def http(self, **kwargs) -> httpx.Client:
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=kwargs.pop("timeout", 300), **kwargs)

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60.0) -> int:
        """Signal the server and wait for it; returns its exit code (SIGKILL after `timeout`).
        In process: stop it as uvicorn does on a signal (0 once it stopped)."""
        if self.in_process is not None:
            self.log.close()
            return self.in_process.stop(timeout)
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


class _InProcess:
    """`omnistage serve ARGV`'s app on uvicorn in a thread of this process."""

    def __init__(self, argv: list[str]):
        import threading

        import uvicorn

        from omnistage.entrypoints.cli import build_parser
        from omnistage.entrypoints.commands.serve import build
        from omnistage.entrypoints.openai.draining_server import DrainingServer

        args = build_parser().parse_args(argv)
        self.engine, app, _ = build(args)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                timeout_graceful_shutdown=args.graceful_timeout)
        self.server = DrainingServer(config, app.state.gateway)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name="omnistage-test-server", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            self.server.run()
        except BaseException as e:  # noqa: BLE001 - reported by the health wait
            self.error = e

    def stop(self, timeout: float) -> int:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.engine.close()  # the app's lifespan closed it already; closing twice is a no-op
        return 0 if not self.thread.is_alive() and self.error is None else 1
