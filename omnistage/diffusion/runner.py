"""The runner holds one pipeline and runs scheduler batches on it.

Request mode: `pipeline.forward(requests)` runs the whole loop for the batch. Step mode:
new requests are encoded into `DenoiseState`s kept here by request id, every state in the
batch takes one `denoise_step`, and finished states are decoded and dropped. A failure
fails the requests of the call that raised (encode, step or decode) and the runner keeps
serving the rest; failed states are dropped like finished ones.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
import torch

from omnistage.diffusion.pipeline import DenoiseState, DiffusionPipelineBase, DiffusionRequest
from omnistage.diffusion.sched.output import RunnerOutput, SchedulerOutput
from omnistage.engine.types import ImagePayload, ProgressPayload

ProgressSink = Callable[[list[tuple[str, ProgressPayload]]], None]


def error_message(exc: BaseException) -> str:
    """One line for the user; the traceback's last frame says where."""
    frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {frame[0].filename.rsplit('/', 1)[-1]}:{frame[0].lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"


class DiffusionRunner:
    def __init__(self, pipeline: DiffusionPipelineBase):
        self.pipeline = pipeline
        self.states: dict[str, DenoiseState] = {}  # step mode: request id -> its state

    def check_request(self, request: DiffusionRequest) -> tuple[DiffusionRequest, tuple]:
        """Fill defaults and validate (raises ValueError naming the field); return the
        prepared request and its batch key."""
        request = self.pipeline.prepare_request(request)
        return request, self.pipeline.batch_key(request.params)

    @torch.no_grad()
    def execute(self, batch: SchedulerOutput, on_progress: ProgressSink | None = None) -> RunnerOutput:
        for rid in batch.finished_req_ids:
            self.states.pop(rid, None)
        if batch.mode == "request":
            return self._run_requests(batch, on_progress)
        return self._run_step(batch, on_progress)

    # -- request mode --------------------------------------------------------------------

    def _run_requests(self, batch: SchedulerOutput, on_progress: ProgressSink | None) -> RunnerOutput:
        out = RunnerOutput()

        def on_step(states: list[DenoiseState]) -> None:
            events = self._progress(states)
            if batch.report_progress:
                out.progress.extend(events)
            if on_progress is not None:
                on_progress(events)

        try:
            payloads = self.pipeline.forward(batch.new_requests, on_step=on_step)
        except Exception as exc:  # noqa: BLE001 - a bad batch fails its requests, not the worker
            return RunnerOutput.failed(batch, error_message(exc))
        out.payloads = {r.request_id: p for r, p in zip(batch.new_requests, payloads)}
        return out

    # -- step mode -----------------------------------------------------------------------

    def _run_step(self, batch: SchedulerOutput, on_progress: ProgressSink | None) -> RunnerOutput:
        out = RunnerOutput()
        # 1. Encode the joiners; they take their first step below.
        if batch.new_requests:
            self._encode(out, batch.new_requests)
        # 2. One denoising step over everyone running.
        states = []
        for rid in batch.req_ids:
            if rid in self.states:
                states.append(self.states[rid])
            elif rid not in out.errors:
                out.errors[rid] = f"RuntimeError: the worker holds no state for request {rid!r}"
        if not states:
            return out
        try:
            self.pipeline.denoise_step(states)
        except Exception as exc:  # noqa: BLE001
            self._fail(out, [s.request.request_id for s in states], error_message(exc))
            return out
        out.progress = self._progress(states)
        if batch.preview_interval:
            self._add_previews(out, states, batch.preview_interval)
        if on_progress is not None:
            on_progress(out.progress)
        # 3. Decode and drop the finished ones.
        done = [s for s in states if s.is_done]
        if done:
            try:
                payloads = self.pipeline.decode(done)
            except Exception as exc:  # noqa: BLE001
                self._fail(out, [s.request.request_id for s in done], error_message(exc))
                return out
            for state, payload in zip(done, payloads):
                rid = state.request.request_id
                out.payloads[rid] = payload
                del self.states[rid]
        return out

    def _encode(self, out: RunnerOutput, requests: list[DiffusionRequest]) -> None:
        """Encode joiners together; if that fails, one by one, so that one bad request
        (nothing has run on it yet) does not take its co-joiners down."""
        try:
            states = self.pipeline.encode(requests)
        except Exception as exc:  # noqa: BLE001
            if len(requests) == 1:
                return self._fail(out, [requests[0].request_id], error_message(exc))
            for request in requests:
                self._encode(out, [request])
            return None
        for state in states:
            self.states[state.request.request_id] = state
        return None

    def _add_previews(self, out: RunnerOutput, states: list[DenoiseState], interval: int) -> None:
        """Decode the current latents of states at a multiple of `interval` steps: the first
        image of the payload, as a rough look at where the request is going."""
        due = [s for s in states if not s.is_done and s.step_index % interval == 0]
        if not due or self.pipeline.output_modality != "image":
            return
        try:
            previews = {s.request.request_id: p for s, p in zip(due, self.pipeline.decode(due))}
        except Exception:  # noqa: BLE001 - a preview is best effort; the request goes on
            return
        for rid, progress in out.progress:
            payload = previews.get(rid)
            if isinstance(payload, ImagePayload) and payload.images:
                progress.preview = payload.images[0]

    def _fail(self, out: RunnerOutput, req_ids: list[str], error: str) -> None:
        for rid in req_ids:
            out.errors[rid] = error
            self.states.pop(rid, None)

    @staticmethod
    def _progress(states: list[DenoiseState]) -> list[tuple[str, ProgressPayload]]:
        return [(s.request.request_id, ProgressPayload(step=s.step_index, num_steps=s.num_steps)) for s in states]
