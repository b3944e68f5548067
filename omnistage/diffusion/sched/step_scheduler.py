"""Step mode: step-level continuous batching. Each batch advances every running request by
one denoising step; requests join and leave between steps.

NOTE on the algorithm. Every tick: (1) requests that finished or were aborted since the
last tick are listed in `finished_req_ids` so workers free their states; (2) waiting
requests join in FIFO order while the running set has room (`max_num_seqs`), and are
sent in full to be encoded and take their first step in this same batch; (3) everyone
running takes one step. Requests with different step counts or sizes share the running
set: the pipeline groups states that one transformer call cannot mix. When nothing runs,
a not-full first batch waits up to `request_batch_max_wait_ms` for a burst, as in
request mode; once something runs, joiners never wait longer than one step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from omnistage.diffusion.sched.base import SchedulerBase
from omnistage.diffusion.sched.output import RunnerOutput, SchedulerOutput
from omnistage.diffusion.sched.request import EngineRequest, RequestStatus


class StepScheduler(SchedulerBase):
    mode = "step"

    def __init__(self, max_num_seqs: int = 1, max_wait_ms: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, preview_interval: int = 0):
        super().__init__(max_num_seqs, max_wait_ms, clock)
        if preview_interval < 0:
            raise ValueError(f"preview_interval must be >= 0, got {preview_interval}")
        self.preview_interval = preview_interval
        self.running: list[EngineRequest] = []

    def abort_request(self, request_id: str) -> bool:
        req = self.requests.get(request_id)
        if req is not None and req in self.running:
            self.running.remove(req)
        return super().abort_request(request_id)

    def schedule(self) -> SchedulerOutput:
        num_free = self.max_num_seqs - len(self.running)
        joiners = list(self.waiting)[: max(num_free, 0)]
        if not self.running and joiners and self._should_coalesce(len(joiners)):
            joiners = []
        for req in joiners:
            self.waiting.popleft()
        batch = SchedulerOutput(
            self.mode,
            new_requests=[r.request for r in joiners],
            running_req_ids=[r.request_id for r in self.running],
            finished_req_ids=self._take_finished_ids(),
            preview_interval=self.preview_interval,
        )
        self.running.extend(joiners)
        now = self.clock()
        for req in self.running:
            req.record_batch(len(self.running), now)
        return batch

    def update(self, batch: SchedulerOutput, output: RunnerOutput) -> list[EngineRequest]:
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

    def fail_all(self) -> list[EngineRequest]:
        self.running.clear()
        return super().fail_all()
