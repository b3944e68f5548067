"""The two objects that cross the executor boundary, modelled on vLLM's SchedulerOutput
and ModelRunnerOutput: what to run (scheduler -> workers) and what came of it (back).

A batch is one denoising step, in both modes: `new_requests` are encoded and join this
step, `running_req_ids` name requests the runner already holds a `DenoiseState` for, and
`finished_req_ids` are requests that left (finished or aborted) since the last batch, so
the runner frees their states. Both cross process boundaries, so they hold plain
picklable data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omnistage.core.types import ProgressPayload
from omnistage.diffusion.request import DiffusionRequest

@dataclass
class SchedulerOutput:
    new_requests: list[DiffusionRequest] = field(default_factory=list)
    """Sent in full, once: the joiners (encoded, then they take their first step)."""
    running_req_ids: list[str] = field(default_factory=list)
    """Already-encoded requests to advance by one step."""
    finished_req_ids: set[str] = field(default_factory=set)
    """Requests that left since the last batch: workers drop their states."""
    updates: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """request_id -> prompt updates that arrived for it since the last batch, in order
    (`DiffusionPipelineBase.update_prompt`), applied before this batch's step."""

    @property
    def req_ids(self) -> list[str]:
        """Every request this batch computes on, new first."""
        return [r.request_id for r in self.new_requests] + list(self.running_req_ids)

    @property
    def num_reqs(self) -> int:
        return len(self.new_requests) + len(self.running_req_ids)

    @property
    def is_empty(self) -> bool:
        """Nothing to compute and nothing to free: no need to call the workers."""
        return self.num_reqs == 0 and not self.finished_req_ids


@dataclass
class RunnerOutput:
    progress: list[tuple[str, ProgressPayload]] = field(default_factory=list)
    """(request_id, progress) per denoising step per request, in order."""
    payloads: dict[str, Any] = field(default_factory=dict)
    """request_id -> ImagePayload | VideoPayload for requests that finished."""
    chunks: list[tuple[str, Any]] = field(default_factory=list)
    """(request_id, VideoPayload with is_chunk) for each piece of output a chunked pipeline
    finished in this batch, in order (`DiffusionPipelineBase.take_chunks`)."""
    errors: dict[str, str] = field(default_factory=dict)
    """request_id -> error message for requests that failed in this batch."""
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    """request_id -> what the pipeline reports for a finished request (transformer forwards
    computed and skipped), merged into its output's metrics."""

    @classmethod
    def failed(cls, batch: SchedulerOutput, error: str) -> "RunnerOutput":
        return cls(errors={rid: error for rid in batch.req_ids})
