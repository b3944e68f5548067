"""Step mode: step-level continuous batching; requests join and leave between steps.

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

from omnistage.diffusion.sched.base import SchedulerBase
from omnistage.diffusion.sched.request import EngineRequest


class StepScheduler(SchedulerBase):
    mode = "step"

    def _admit(self) -> list[EngineRequest]:
        num_free = self.max_num_seqs - len(self.running)
        joiners = list(self.waiting)[: max(num_free, 0)]
        if joiners and self._should_coalesce(len(joiners)):
            return []
        for _ in joiners:
            self.waiting.popleft()
        return joiners
