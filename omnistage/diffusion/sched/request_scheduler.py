"""Request mode: whole requests are batched; one batch runs `pipeline.forward` start to end.

NOTE on the algorithm. Admission is FIFO by the head of the queue: the oldest waiting
request fixes the batch key, and the batch takes, in arrival order, up to `max_num_seqs`
waiting requests with that key. Incompatible requests keep their place and one of them
heads the next batch, so none starves. A batch that is not full waits for a burst to fill
it until its oldest request is `request_batch_max_wait_ms` old.
"""

from __future__ import annotations

from omnistage.diffusion.sched.base import SchedulerBase
from omnistage.diffusion.sched.output import RunnerOutput, SchedulerOutput
from omnistage.diffusion.sched.request import EngineRequest, RequestStatus


class RequestScheduler(SchedulerBase):
    mode = "request"

    def schedule(self) -> SchedulerOutput:
        # Workers keep no per-request state in request mode; aborts need no freeing.
        self._take_finished_ids()
        if not self.waiting:
            return SchedulerOutput(self.mode)
        key = self.waiting[0].batch_key
        batch = [r for r in self.waiting if r.batch_key == key][: self.max_num_seqs]
        if self._should_coalesce(len(batch)):
            return SchedulerOutput(self.mode)
        now = self.clock()
        for req in batch:
            self.waiting.remove(req)
            req.record_batch(len(batch), now)
        return SchedulerOutput(self.mode, new_requests=[r.request for r in batch])

    def update(self, batch: SchedulerOutput, output: RunnerOutput) -> list[EngineRequest]:
        self._apply_progress(output)
        finished = []
        for rid in batch.req_ids:
            status = RequestStatus.FINISHED if rid in output.payloads else RequestStatus.FAILED
            req = self._finish(rid, status)
            if req is not None:
                finished.append(req)
        return finished
