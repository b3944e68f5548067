"""Service processes: long-running children that are not engines (the API servers), kept
alive by the same `Supervisor` as the stages.

A `ServiceEndpoint` spawns `target(conn, *args)` with one end of a duplex pipe. The child
sends ("ready", pid) on it once it can serve; `wait_ready` hands the pipe to `on_ready` and
keeps out of it from then on (the service's own traffic runs over it, e.g. rpc.py). The
endpoint takes no commands: for the supervisor it only reports the child's death, which
the supervisor answers as for a stage, by rebuilding it with backoff.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omnistage.runtime import process
from omnistage.runtime.loop import Event


class ServiceEndpoint:
    beats = False  # a service answers its own clients; it has no engine steps to time

    def __init__(self, label: str, target: Callable[..., Any], args: tuple, on_ready: Callable[[Any], None],
                 stop_timeout_s: float = process.STOP_TIMEOUT_S):
        self.label = label
        self.pid: int | None = None
        self._on_ready = on_ready
        self._stop_timeout_s = stop_timeout_s
        self._conn, child_end = process.pipe(duplex=True)
        self._proc = process.spawn(target, (child_end, *args), name=f"omnistage-{label}", daemon=True,
                                   preloaded=False)  # an API server imports no torch: see EngineFacts
        child_end.close()
        self._gone = False

    def wait_ready(self, timeout: float) -> None:
        if not self._conn.poll(timeout):
            self.close(graceful=False)
            raise RuntimeError(f"{self.label} did not start within {timeout:.0f} s")
        try:
            kind, body = self._conn.recv()
        except (EOFError, OSError):
            kind, body = "init_error", f"the process {process.describe_exit(self._proc)[0]}"
        if kind != "ready":
            self.close(graceful=False)
            raise RuntimeError(f"{self.label} failed to start:\n{body}")
        self.pid = body
        self._on_ready(self._conn)

    def send(self, kind: str, body: Any) -> str | None:
        return f"{self.label} takes no {kind!r} commands"

    def step(self) -> list[Event]:
        if self._gone or self._proc.is_alive():
            return []
        self._gone = True
        how, crashed = process.describe_exit(self._proc)
        return [("died", f"{self.label} died ({how})", crashed)]

    def has_local_work(self) -> bool:
        return False

    def wait_objects(self) -> list[Any]:
        return [] if self._gone else [self._proc.sentinel]

    def close(self, graceful: bool = True) -> None:
        """`graceful`: SIGTERM, so the service finishes what it serves (up to `stop_timeout_s`)."""
        if self._proc.is_alive():
            if graceful:
                self._proc.terminate()
            else:
                self._proc.kill()
        process.stop([self._proc], self._stop_timeout_s)
