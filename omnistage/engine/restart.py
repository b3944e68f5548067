"""Self-healing stages: `RestartingStageHandle` rebuilds a stage that died.

When the stage it wraps turns unhealthy (its process died, or its inline engine lost a
worker process), the requests the stage held fail as "unavailable" (the server answers
503 with Retry-After), and a background thread rebuilds the stage: bounded attempts
with exponential backoff (`RestartPolicy`). Requests that arrive meanwhile fail as
"unavailable" at once; once the new engine is up, the stage is healthy again and serves.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omnistage.core.errors import ErrorKind
from omnistage.core.types import StageOutput, StageRequest
from omnistage.engine.stage_handle import CLOSE_TIMEOUT_S, StageHandle, error_output

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    """How a stage that died is rebuilt."""

    max_attempts: int = 5
    """Rebuild attempts after one death before the stage stays down (0: never restart)."""
    backoff_s: float = 0.5
    """Wait before the first attempt; doubled after each failed one."""
    max_backoff_s: float = 30.0


NO_RESTART = RestartPolicy(max_attempts=0)


class RestartingStageHandle(StageHandle):
    """A stage handle that rebuilds its stage when it dies (see the module docstring).

    `build(generation)` makes a new inner handle (it is called in the restart thread; the
    generation keeps a new process's shared-memory names apart from the dead one's).
    Everything else runs on the orchestrator's thread, like any handle; `is_healthy` may
    be called from any thread.
    """

    def __init__(self, label: str, handle: StageHandle, build: Callable[[int], StageHandle], policy: RestartPolicy):
        self.label = label
        self.handle: StageHandle | None = handle
        self.policy = policy
        self.num_restarts = 0
        self.down_reason: str | None = None
        """Why the stage is down (restarting, or given up), or None while it serves."""
        self.gave_up = False
        self.live: set[str] = set()
        self._build = build
        self._failed: list[StageOutput] = []
        self._init_timeout_s = 600.0
        self._lock = threading.Lock()
        self._ready: StageHandle | None = None  # built by the restart thread, adopted by step()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)

    def wait_ready(self, timeout: float) -> None:
        self._init_timeout_s = timeout
        if self.handle is not None:
            self.handle.wait_ready(timeout)

    def add_request(self, request: StageRequest) -> None:
        if self.handle is None:
            self._failed.append(error_output(request.request_id, self._unavailable_message(), ErrorKind.UNAVAILABLE))
            return
        self.live.add(request.request_id)
        self.handle.add_request(request)

    def abort_request(self, request_id: str) -> None:
        self.live.discard(request_id)
        if self.handle is not None:
            self.handle.abort_request(request_id)

    def step(self) -> list[StageOutput]:
        outputs, self._failed = self._failed, []
        self._adopt_restarted()
        if self.handle is None:
            return outputs
        stepped = self.handle.step()
        for out in stepped:
            if out.finished or out.error is not None:
                self.live.discard(out.request_id)
        if not self.handle.is_healthy():
            reason = self._death_reason(stepped)
            # What the dead engine failed in this step failed because it died: retry later.
            for out in stepped:
                if out.error is not None and out.error_kind is None:
                    out.error_kind = ErrorKind.UNAVAILABLE
            stepped += [error_output(rid, f"{reason}; request not completed", ErrorKind.UNAVAILABLE) for rid in sorted(self.live)]
            self.live.clear()
            self._on_death(reason)
        return outputs + stepped

    @staticmethod
    def _death_reason(stepped: list[StageOutput]) -> str:
        errors = [out.error for out in stepped if out.error]
        return errors[0].removesuffix("; request not completed") if errors else "the stage engine became unhealthy"

    def _unavailable_message(self) -> str:
        if self.gave_up:
            return f"the stage is down ({self.down_reason}) and could not be restarted"
        return f"the stage is restarting after: {self.down_reason}"

    def _on_death(self, reason: str) -> None:
        dead, self.handle = self.handle, None
        self.down_reason = reason
        logger.error("stage %s died: %s", self.label, reason)
        if self.policy.max_attempts < 1:
            self.gave_up = True
            logger.error("stage %s stays down (restarts are off)", self.label)
            _close_quietly(dead)
            return
        self._thread = threading.Thread(target=self._restart, args=(dead,), name=f"omnistage-restart-{self.label}",
                                        daemon=True)
        self._thread.start()

    def _restart(self, dead: StageHandle) -> None:
        """The restart thread: close the dead stage, then build a new one, with backoff."""
        _close_quietly(dead)
        delay = self.policy.backoff_s
        for attempt in range(1, self.policy.max_attempts + 1):
            if self._closed.wait(delay):
                return
            logger.warning("stage %s: restart attempt %d of %d", self.label, attempt, self.policy.max_attempts)
            try:
                handle = self._build(self.num_restarts + attempt)
                handle.wait_ready(self._init_timeout_s)
            except Exception:
                logger.exception("stage %s: restart attempt %d failed", self.label, attempt)
                delay = min(delay * 2, self.policy.max_backoff_s)
                continue
            with self._lock:
                if self._closed.is_set():
                    _close_quietly(handle)
                    return
                self._ready = handle
            self._wake()
            return
        self.gave_up = True
        logger.error("stage %s stays down: %d restart attempts failed", self.label, self.policy.max_attempts)

    def _adopt_restarted(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, None
        try:
            while self._wake_r.recv(64):
                pass
        except (BlockingIOError, OSError):
            pass
        if ready is not None:
            self.handle, self.down_reason = ready, None
            self.num_restarts += 1
            logger.warning("stage %s is back (restart %d)", self.label, self.num_restarts)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def has_local_work(self) -> bool:
        return bool(self._failed) or (self.handle is not None and self.handle.has_local_work())

    def wait_objects(self) -> list[Any]:
        return [self._wake_r] + (self.handle.wait_objects() if self.handle is not None else [])

    def is_healthy(self) -> bool:
        handle = self.handle
        return handle is not None and self.down_reason is None and handle.is_healthy()

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            ready, self._ready = self._ready, None
        for handle in (self.handle, ready):
            if handle is not None:
                _close_quietly(handle)
        if self._thread is not None:
            self._thread.join(CLOSE_TIMEOUT_S)
        self._wake_r.close()
        self._wake_w.close()


def _close_quietly(handle: StageHandle) -> None:
    try:
        handle.close()
    except Exception:
        logger.exception("closing a stage handle failed")
