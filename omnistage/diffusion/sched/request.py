"""A request as the diffusion schedulers see it: the pipeline request plus its bookkeeping.

User params (`DiffusionParams`), per-step tensors (`DenoiseState`, worker side) and
outputs are separate types; this one only holds what scheduling needs: the batch key,
timestamps, status and step counts. No torch, no device.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass

from omnistage.diffusion.request import DiffusionRequest


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED, RequestStatus.FAILED, RequestStatus.ABORTED)


@dataclass
class EngineRequest:
    request: DiffusionRequest
    """What the pipeline gets (prompt, validated params, input images); sent to workers in full once."""
    batch_key: Hashable
    """Request mode batches only requests whose keys are equal."""
    arrival_time: float
    """When the engine took it (its clock): the queue time and the burst coalescing window start here."""
    submitted_time: float | None = None
    """When the orchestrator made it (`StageRequest.arrival_time`, the orchestrator's clock): its place
    in the waiting queue, so a request re-run here after its replica died goes ahead of newer work."""
    status: RequestStatus = RequestStatus.WAITING
    scheduled_time: float | None = None
    """When it first entered a batch (queue_time = scheduled_time - arrival_time)."""
    finish_time: float | None = None
    num_steps_done: int = 0
    num_steps: int | None = None
    """Known from params up front; corrected by the runner's progress events."""
    batch_size_sum: int = 0
    """Sum over the batches it ran in of their sizes; with num_batches gives the mean batch size."""
    num_batches: int = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def mean_batch_size(self) -> float:
        return self.batch_size_sum / self.num_batches if self.num_batches else 0.0

    def record_batch(self, batch_size: int, now: float) -> None:
        if self.scheduled_time is None:
            self.scheduled_time = now
        self.status = RequestStatus.RUNNING
        self.batch_size_sum += batch_size
        self.num_batches += 1
