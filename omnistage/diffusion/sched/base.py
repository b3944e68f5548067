"""What both diffusion schedulers share: the waiting queue in arrival order (core/queueing.py),
the running set that takes one denoising step per batch, aborts, burst coalescing, and the
bookkeeping that turns a `RunnerOutput` into finished requests.

Every batch is one denoising step for every running request, in both modes; the modes
differ only in admission (`_admit`): request mode forms a batch once and runs it to the
end, step mode lets requests join between steps. So progress is live and an abort stops
a request's compute at the next step in both.

Schedulers are plain Python over `EngineRequest`s: no torch, no device, an injectable
clock, so tests drive them directly with hand-built runner outputs.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable

from omnistage.core.errors import RequestError
from omnistage.core.queueing import insert_by_arrival

from omnistage.diffusion.sched.output import RunnerOutput, SchedulerOutput
from omnistage.diffusion.sched.request import EngineRequest, RequestStatus


class SchedulerBase(ABC):
    mode: str

    def __init__(self, max_num_seqs: int = 1, max_wait_ms: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_wait_ms < 0:
            raise ValueError(f"request_batch_max_wait_ms must be >= 0, got {max_wait_ms}")
        self.max_num_seqs = max_num_seqs
        self.max_wait = max_wait_ms / 1000.0
        self.clock = clock
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.requests: dict[str, EngineRequest] = {}  # every unfinished request, by id
        self.finished_req_ids: set[str] = set()  # left since the last batch; sent so workers free state

    # -- admission -------------------------------------------------------------------------

    def add_request(self, req: EngineRequest) -> None:
        if req.request_id in self.requests:
            raise RequestError("request_id", f"request_id: {req.request_id!r} is already running")
        self.requests[req.request_id] = req
        insert_by_arrival(self.waiting, req, lambda r: r.submitted_time)

    def abort_request(self, request_id: str) -> bool:
        """Drop a request. A running one leaves before the next step, and the workers free
        its state with that batch. Returns whether the id was known."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        if req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        else:
            self.running.remove(req)
            self.finished_req_ids.add(request_id)
        req.status = RequestStatus.ABORTED
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_request(self, request_id: str) -> EngineRequest | None:
        return self.requests.get(request_id)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @abstractmethod
    def _admit(self) -> list[EngineRequest]:
        """The waiting requests that join the running set in this batch (removed from `waiting`)."""

    # -- coalescing ------------------------------------------------------------------------

    def wait_time(self) -> float:
        """Seconds until the head of the queue stops waiting for a burst to fill its batch
        (0 when there is nothing to wait for). The engine sleeps at most this long."""
        if not self.waiting or self.max_wait <= 0:
            return 0.0
        return max(0.0, self.waiting[0].arrival_time + self.max_wait - self.clock())

    def _should_coalesce(self, num_ready: int) -> bool:
        """Hold a not-full first batch back while its oldest request is younger than max_wait."""
        return not self.running and num_ready < self.max_num_seqs and self.wait_time() > 0

    # -- the step --------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        joiners = self._admit()
        batch = SchedulerOutput(
            new_requests=[r.request for r in joiners],
            running_req_ids=[r.request_id for r in self.running],
            finished_req_ids=self._take_finished_ids(),
        )
        self.running.extend(joiners)
        now = self.clock()
        for req in self.running:
            req.record_batch(len(self.running), now)
        return batch

    def update(self, batch: SchedulerOutput, output: RunnerOutput) -> list[EngineRequest]:
        """Apply a runner output; return the requests that finished or failed in it."""
        self._apply_progress(output)
        finished = []
        for rid in batch.req_ids:
            if rid in output.payloads:
                status = RequestStatus.FINISHED
            elif rid in output.errors:
                status = RequestStatus.FAILED
            else:
                continue  # still denoising
            req = self._finish(rid, status)
            if req is not None:
                self.running.remove(req)
                finished.append(req)
                if status is RequestStatus.FAILED:
                    self.finished_req_ids.add(rid)  # the runner may still hold its state
        return finished

    def _take_finished_ids(self) -> set[str]:
        ids, self.finished_req_ids = self.finished_req_ids, set()
        return ids

    def _apply_progress(self, output: RunnerOutput) -> None:
        for rid, progress in output.progress:
            req = self.requests.get(rid)
            if req is not None:
                req.num_steps_done = progress.step
                req.num_steps = progress.num_steps

    def _finish(self, rid: str, status: RequestStatus) -> EngineRequest | None:
        """Retire a live request; None when it was aborted meanwhile."""
        req = self.requests.pop(rid, None)
        if req is None:
            return None
        req.status = status
        req.finish_time = self.clock()
        return req

    def fail_all(self) -> list[EngineRequest]:
        """Retire every unfinished request as failed (the workers are gone)."""
        failed = [self._finish(rid, RequestStatus.FAILED) for rid in list(self.requests)]
        self.waiting.clear()
        self.running.clear()
        return [r for r in failed if r is not None]
