"""Supervisor: the one object that knows which requests a stage holds, and heals the stage.

The orchestrator talks to each stage through a `Supervisor`, which talks to the stage's
engine through an endpoint (inline, process or Ray; endpoint.py). Nothing else tracks
liveness. The supervisor

- keeps the requests the stage holds, and drops outputs of requests it no longer holds
  (aborted ones);
- turns a "step_failed" event into error outputs for every request the engine held (the
  engine goes on);
- turns a death (a "died" event, a dead process, a panic of an inline engine) or a hang
  (no event from a process or Ray loop for `stage_timeout_s`) into `UNAVAILABLE` outputs
  for every request the stage held (the server answers 503 with Retry-After), and
  rebuilds the stage in a background thread: bounded attempts with exponential backoff
  (`RestartPolicy`). Requests that arrive meanwhile fail as unavailable at once;
- remembers the requests a stage was running when it crashed by itself (a panic, a fatal
  signal, an exit code: `crashed`), by a fingerprint of their inputs and params; a
  fingerprint that crashed the stage `MAX_CRASHES_PER_REQUEST` times is refused at
  admission, so no client can keep a stage down by repeating one request;
- gives a rebuilt engine the standing calls its caller set (`standing`, e.g. "sleep" while
  the engine sleeps), so a stage rebuilt meanwhile does not come back in another state;
- after a death it did not cause itself (a kill from outside, a hang, a lost node), keeps the
  requests it held that had sent no output yet (`orphans`, until its next step), so the
  stage's replica set can re-run them on another replica.

Threads: everything runs on the orchestrator's thread except the restart thread (which
builds the new endpoint and hands it over), and `is_healthy` and `call` (a control call:
request/reply, e.g. sleep/wake), which any thread may call.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omnistage.core.errors import ErrorKind
from omnistage.core.types import InputChunk, ProgressPayload, StageOutput, StageRequest
from omnistage.runtime.channel import serialize
from omnistage.runtime.endpoint import Endpoint, Waker

logger = logging.getLogger(__name__)

MAX_CRASHES_PER_REQUEST = 2
STAGE_TIMEOUT_FLOOR_S = 120.0
STAGE_TIMEOUT_STEPS = 10
"""With no `stage_timeout_s`: a loop is hung after max(floor, this many times its slowest step so far)."""
CLOSE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RestartPolicy:
    """How a stage that died is rebuilt, and when a silent one counts as hung."""

    max_restarts: int = 5
    """Rebuild attempts after one death before the stage stays down (0: never restart)."""
    backoff_s: float = 0.5
    """Wait before the first attempt; doubled after each failed one."""
    max_backoff_s: float = 30.0
    stage_timeout_s: float | None = None
    """A process or Ray stage that sends nothing for this long is hung; None: sized from its
    slowest step (see STAGE_TIMEOUT_STEPS)."""


@dataclass
class _Held:
    request: StageRequest
    fingerprint: str | None = None
    has_output: bool = False
    """It sent something other than progress, or took streamed input: a re-run elsewhere would
    repeat what it sent, or miss what it was fed before."""


class Supervisor:
    """One stage, as the orchestrator sees it (see the module docstring).

    `build(generation)` makes a new endpoint; generation 0 at start, then one per rebuild
    (it keeps a new process's shared-memory names apart from the dead one's). Replicas of
    one stage share `crashes`, so a poison request is refused by all of them. `on_close` gives back
    what the stage holds besides its endpoints (a Ray copy's placement bundle), once it is closed.
    """

    def __init__(self, label: str, build: Callable[[int], Endpoint], policy: RestartPolicy = RestartPolicy(),
                 crashes: dict[str, int] | None = None, on_close: Callable[[], None] | None = None):
        self.label = label
        self.policy = policy
        self.endpoint: Endpoint | None = build(0)
        self.num_restarts = 0
        self.down_reason: str | None = None
        """Why the stage is down (restarting, or given up), or None while it serves."""
        self.gave_up = False
        self.held: dict[str, _Held] = {}
        self.crashes: dict[str, int] = crashes if crashes is not None else {}
        """Fingerprint -> how many times a request with it was running when the stage crashed."""
        self.orphans: dict[str, StageRequest] = {}
        """Requests failed by the last death (not a crash of its own) that had sent no output (and took
        no streamed input): safe to re-run elsewhere. Cleared by the next step()."""
        self._build = build
        self._on_close = on_close
        self._outputs: list[StageOutput] = []  # answered here, handed out by the next step()
        self._calls: dict[int, Any] = {}
        self.standing: dict[str, tuple] = {}
        """Control calls (method -> args) a rebuilt engine gets before it serves; set and cleared by
        the caller (AsyncOmni's sleep and wake_up), from any thread."""
        self._next_call = 0
        self._last_event = time.monotonic()
        self._slowest_step_s = 0.0
        self._step_started: float | None = None
        self._lock = threading.Lock()
        self._ready: Endpoint | None = None  # built by the restart thread, adopted by step()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._waker = Waker()
        self._init_timeout_s = 600.0  # longest a rebuilt stage may take to load: as long as the first

    def wait_ready(self, timeout: float) -> None:
        self._init_timeout_s = timeout
        if self.endpoint is not None:
            self.endpoint.wait_ready(timeout)
        self._last_event = time.monotonic()

    # -- requests ------------------------------------------------------------------------

    def add_request(self, request: StageRequest) -> None:
        rid = request.request_id
        fingerprint = self._fingerprint(request) if self.crashes else None
        refused = self._refusal(fingerprint)
        if refused is not None:
            self._outputs.append(_error(rid, refused, ErrorKind.INVALID_REQUEST))
            return
        if self.endpoint is None:
            self._outputs.append(_error(rid, self._unavailable_message(), ErrorKind.UNAVAILABLE))
            return
        # A request fed by a stream (an AR request's next chunk, or one part of a streamed input) cannot be
        # re-run alone, without what came before it: count it as started.
        fed = isinstance(request.inputs, InputChunk) or request.stream_of is not None
        self.held[rid] = _Held(request, fingerprint, has_output=fed)
        problem = self.endpoint.send("add", request)
        if problem is not None:
            del self.held[rid]
            self._outputs.append(_error(rid, problem))

    def refusal(self, request: StageRequest) -> str | None:
        """Why `add_request` would refuse `request` as poison (None: it would not), from any
        thread: the server asks before it answers for work that runs later (a video job)."""
        return self._refusal(self._fingerprint(request) if self.crashes else None)

    def _refusal(self, fingerprint: str | None) -> str | None:
        crashes = self.crashes.get(fingerprint, 0) if fingerprint is not None else 0
        if crashes < MAX_CRASHES_PER_REQUEST:
            return None
        return f"refused: a request with these inputs and params crashed the stage {crashes} times"

    def abort_request(self, request_id: str) -> None:
        if self.held.pop(request_id, None) is not None and self.endpoint is not None:
            self.endpoint.send("abort", request_id)

    def abort_stream(self, stream_id: str) -> None:
        """End a streamed input (`StageRequest.stream_of`) that no held part belongs to: the engine
        may keep state for it between parts (a decoder's stream)."""
        if self.endpoint is not None:
            self.endpoint.send("abort", stream_id)

    def call(self, method: str, *args: Any) -> Any:
        """Call `method(*args)` on the engine, from any thread; a Future that the reply resolves
        (on the orchestrator's thread), or that fails when the stage dies first."""
        from concurrent.futures import Future

        future: Future = Future()
        endpoint = self.endpoint
        if endpoint is None:
            future.set_exception(RuntimeError(self._unavailable_message()))
            return future
        with self._lock:
            call_id, self._next_call = self._next_call, self._next_call + 1
            self._calls[call_id] = future
        endpoint.send("call", (call_id, method, args))
        self._waker.wake()  # an idle orchestrator steps an inline stage (and reads its reply) at once
        return future

    # -- the orchestrator's step ---------------------------------------------------------

    def step(self) -> list[StageOutput]:
        """Outputs since the last call. Inline: runs one engine step. Never blocks."""
        outputs, self._outputs = self._outputs, []
        self.orphans = {}
        self._waker.drain()
        self._adopt_restarted()
        if self.endpoint is None:
            return outputs
        self._step_started = time.monotonic()
        events = self.endpoint.step()
        self._step_started = None
        if events:
            self._last_event = time.monotonic()
        for event in events:
            kind = event[0]
            if kind == "outputs":
                outputs += self._keep_held(event[1])
            elif kind == "step_failed":
                outputs += self._fail_held(event[1])
            elif kind == "died":
                outputs += self._on_death(event[1], event[2], outputs)
                break
            elif kind == "beat":
                self._slowest_step_s = max(self._slowest_step_s, event[1])
            elif kind == "reply":
                self._resolve(*event[1:])
        if self.endpoint is not None and self._is_hung(self.endpoint):
            silent = time.monotonic() - self._last_event
            outputs += self._on_death(f"the stage hung (no sign of life for {silent:.0f} s)", False, outputs,
                                      hung=True)
        return outputs

    def _keep_held(self, outputs: list[StageOutput]) -> list[StageOutput]:
        kept = []
        for out in outputs:
            held = self.held.get(out.request_id)
            if held is not None:
                if out.finished or out.error is not None:
                    del self.held[out.request_id]
                elif not isinstance(out.payload, ProgressPayload):
                    held.has_output = True
                kept.append(out)
        return kept

    def _fail_held(self, message: str) -> list[StageOutput]:
        """A step raised: the engine cannot say which request broke the batch, so all fail."""
        failed = []
        for rid in sorted(self.held):
            self.endpoint.send("abort", rid)
            failed.append(_error(rid, message))
        self.held.clear()
        return failed

    def _on_death(self, reason: str, crashed: bool, stepped: list[StageOutput], hung: bool = False) -> list[StageOutput]:
        dead, self.endpoint = self.endpoint, None
        self.down_reason = reason
        logger.error("stage %s is down: %s", self.label, reason)
        # What failed in this step failed because the stage died: it may be retried.
        for out in stepped:
            if out.error is not None and out.error_kind is None:
                out.error_kind = ErrorKind.UNAVAILABLE
        if crashed:
            for held in self.held.values():
                held.fingerprint = held.fingerprint or self._fingerprint(held.request)
                self.crashes[held.fingerprint] = self.crashes.get(held.fingerprint, 0) + 1
        message = f"{reason}, while running this request" if crashed else reason
        failed = [_error(rid, message, ErrorKind.UNAVAILABLE) for rid in sorted(self.held)]
        # A stage that crashed by itself may have been crashed by one of these requests: re-run together on
        # another copy, one poison request would take the copies down in turn (and count the others twice).
        # Those fail as they would with one copy; a kill from outside, a hang or a lost node re-runs them.
        if not crashed:
            self.orphans = {rid: held.request for rid, held in self.held.items() if not held.has_output}
        self.held.clear()
        for future in self._calls.values():
            future.set_exception(RuntimeError(reason))
        self._calls.clear()
        if self.policy.max_restarts < 1 or self._closed.is_set():
            self.gave_up = True
            logger.error("stage %s stays down (restarts are off)", self.label)
            _close_quietly(dead, graceful=not hung)
        else:
            self._thread = threading.Thread(target=self._restart, args=(dead, hung),
                                            name=f"omnistage-restart-{self.label}", daemon=True)
            self._thread.start()
        return failed

    def _resolve(self, call_id: int, ok: bool, value: Any, invalid: bool = False) -> None:
        future = self._calls.pop(call_id, None)
        if future is not None:
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value if isinstance(value, BaseException) else
                                     (ValueError if invalid else RuntimeError)(value))
        elif not ok:  # a standing call no one waits for
            logger.error("stage %s: a standing call failed on the rebuilt engine: %s", self.label, value)

    # -- health --------------------------------------------------------------------------

    def stage_timeout_s(self) -> float:
        if self.policy.stage_timeout_s is not None:
            return self.policy.stage_timeout_s
        return max(STAGE_TIMEOUT_FLOOR_S, STAGE_TIMEOUT_STEPS * self._slowest_step_s)

    def _is_hung(self, endpoint: Endpoint) -> bool:
        """A process or Ray loop beats while it lives; an inline step runs on the caller's thread
        (so only another thread, through is_healthy, can see it take too long)."""
        now, timeout = time.monotonic(), self.stage_timeout_s()
        started = self._step_started
        if started is not None:
            return now - started > timeout
        return endpoint.beats and now - self._last_event > timeout

    def is_healthy(self) -> bool:
        endpoint = self.endpoint
        return endpoint is not None and self.down_reason is None and not self._is_hung(endpoint)

    @property
    def state(self) -> str:
        """"serving" | "hung" (silent, not yet rebuilt) | "restarting" | "down" (gave up)."""
        if self.is_healthy():
            return "serving"
        if self.gave_up:
            return "down"
        return "hung" if self.endpoint is not None else "restarting"

    def _unavailable_message(self) -> str:
        if self.gave_up:
            return f"the stage is down ({self.down_reason}) and could not be restarted"
        return f"the stage is restarting after: {self.down_reason}"

    # -- restarts ------------------------------------------------------------------------

    def _restart(self, dead: Endpoint, hung: bool) -> None:
        """The restart thread: close the dead stage, then build a new one, with backoff."""
        _close_quietly(dead, graceful=not hung)
        delay = self.policy.backoff_s
        for attempt in range(1, self.policy.max_restarts + 1):
            if self._closed.wait(delay):
                return
            logger.warning("stage %s: restart attempt %d of %d", self.label, attempt, self.policy.max_restarts)
            try:
                endpoint = self._build(self.num_restarts + attempt)
                endpoint.wait_ready(self._init_timeout_s)
            except Exception:
                logger.exception("stage %s: restart attempt %d failed", self.label, attempt)
                delay = min(delay * 2, self.policy.max_backoff_s)
                continue
            with self._lock:
                if self._closed.is_set():
                    _close_quietly(endpoint)
                    return
                self._ready = endpoint
            self._waker.wake()
            return
        self.gave_up = True
        logger.error("stage %s stays down: %d restart attempts failed", self.label, self.policy.max_restarts)

    def adopt_standing(self, standing: dict[str, tuple]) -> None:
        """Take another copy's standing calls (a copy joining a sleeping stage sleeps too)."""
        self.standing = dict(standing)
        if self.endpoint is not None:
            for method, args in self.standing.items():
                self.endpoint.send("call", (None, method, args))

    def _adopt_restarted(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is not None:
            for method, args in list(self.standing.items()):
                ready.send("call", (None, method, args))  # no one waits for the reply (call id None)
            self.endpoint, self.down_reason = ready, None
            self._last_event = time.monotonic()
            self.num_restarts += 1
            logger.warning("stage %s is back (restart %d)", self.label, self.num_restarts)

    # -- the orchestrator's wait ---------------------------------------------------------

    def has_local_work(self) -> bool:
        return bool(self._outputs) or (self.endpoint is not None and self.endpoint.has_local_work())

    def wait_objects(self) -> list[Any]:
        return [self._waker] + (self.endpoint.wait_objects() if self.endpoint is not None else [])

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            ready, self._ready = self._ready, None
        for endpoint in (self.endpoint, ready):
            if endpoint is not None:
                _close_quietly(endpoint)
        if self._thread is not None:
            self._thread.join(CLOSE_TIMEOUT_S)
        self._waker.close()
        on_close, self._on_close = self._on_close, None  # once, however often close() is called
        if on_close is not None:
            on_close()

    @staticmethod
    def _fingerprint(request: StageRequest) -> str:
        """A digest of what the request asks (inputs and params, not its id)."""
        try:
            header, buffers = serialize((request.inputs, request.params))
        except Exception:  # noqa: BLE001 - an unpicklable request cannot be remembered
            return f"unpicklable:{request.request_id}"
        digest = hashlib.sha256(header)
        for buf in buffers:
            digest.update(buf)
        return digest.hexdigest()


def _error(request_id: str, message: str, kind: ErrorKind | None = None) -> StageOutput:
    return StageOutput(request_id, None, finished=True, error=message, error_kind=kind)


def _close_quietly(endpoint: Endpoint, graceful: bool = True) -> None:
    try:
        endpoint.close(graceful)
    except Exception:
        logger.exception("closing a stage endpoint failed")
