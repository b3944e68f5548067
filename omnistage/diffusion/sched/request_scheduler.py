"""Request mode: a batch of whole requests is formed once and runs together to the end.

NOTE on the algorithm. Admission happens only when nothing runs, and is FIFO by the head
of the queue: the oldest waiting request fixes the batch key, and the batch takes, in
arrival order, up to `max_num_seqs` waiting requests with that key. Incompatible
requests keep their place and one of them heads the next batch, so none starves. A batch
that is not full waits for a burst to fill it until its oldest request is
`request_batch_max_wait_ms` old. The batch then takes one denoising step per engine step
(see base.py); a request that is aborted or finishes early leaves it, nobody joins.
"""

from __future__ import annotations

from omnistage.diffusion.sched.base import SchedulerBase
from omnistage.diffusion.sched.request import EngineRequest


class RequestScheduler(SchedulerBase):
    mode = "request"

    def _admit(self) -> list[EngineRequest]:
        if self.running or not self.waiting:
            return []
        key = self.waiting[0].batch_key
        batch = [r for r in self.waiting if r.batch_key == key][: self.max_num_seqs]
        if self._should_coalesce(len(batch)):
            return []
        for req in batch:
            self.waiting.remove(req)
        return batch
