"""The runner holds one pipeline and runs scheduler batches on it, one denoising step each.

Every batch, in both scheduling modes: states of requests that left are released; new
requests are encoded into `DenoiseState`s kept here by request id; every running state
takes one `denoise_step`; finished states are decoded and dropped. A failure fails the
requests of the call that raised (encode, step or decode) and the runner keeps serving
the rest; failed states are dropped like finished ones.

A pipeline that makes its output in pieces (Helios' video chunks) hands each finished piece
out after the step that finished it (`take_chunks`), to stream before the request ends.

Requests that ask for `partial_images` get previews (the VAE decode of their current
latents) on the progress events of evenly spaced steps.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

import torch

from omnistage.core.types import ImagePayload, ProgressPayload
from omnistage.diffusion.pipeline import DenoiseState, DiffusionPipelineBase
from omnistage.diffusion.request import DiffusionRequest
from omnistage.diffusion.sched.output import RunnerOutput, SchedulerOutput

ProgressSink = Callable[[list[tuple[str, ProgressPayload]]], None]


def error_message(exc: BaseException) -> str:
    """One line for the user; the traceback's last frame says where."""
    frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {frame[0].filename.rsplit('/', 1)[-1]}:{frame[0].lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"


def preview_steps(num_steps: int, num_previews: int) -> set[int]:
    """The steps (1-based, before the last) after which a request's `num_previews` partial
    images are decoded: evenly spaced, e.g. 2 previews of 9 steps -> after steps 3 and 6."""
    if num_previews <= 0 or num_steps <= 1:
        return set()
    steps = {round(num_steps * (k + 1) / (num_previews + 1)) for k in range(num_previews)}
    return {s for s in steps if 1 <= s < num_steps}


class DiffusionRunner:
    def __init__(self, pipeline: DiffusionPipelineBase):
        self.pipeline = pipeline
        self.states: dict[str, DenoiseState] = {}  # request id -> its state, while it runs

    @torch.no_grad()
    def execute(self, batch: SchedulerOutput, on_progress: ProgressSink | None = None) -> RunnerOutput:
        out = RunnerOutput()
        # 1. Free what left since the last batch (finished, failed or aborted).
        for rid in batch.finished_req_ids:
            self._release(rid)
        # 2. Encode the joiners; they take their first step below.
        if batch.new_requests:
            self._encode(out, batch.new_requests)
        # 3. Prompt updates that came in, then one denoising step over everyone running.
        self._update(out, batch.updates)
        states = []
        for rid in batch.req_ids:
            if rid in self.states:
                states.append(self.states[rid])
            elif rid not in out.errors:
                out.errors[rid] = f"RuntimeError: the worker holds no state for request {rid!r}"
        if not states:
            return out
        try:
            self.pipeline.step(states)
        except Exception as exc:  # noqa: BLE001 - a bad batch fails its requests, not the worker
            self._fail(out, [s.request.request_id for s in states], error_message(exc))
            return out
        out.progress = [(s.request.request_id, ProgressPayload(step=s.step_index, num_steps=s.num_steps))
                        for s in states]
        self._add_previews(out, states)
        out.chunks = [(s.request.request_id, piece) for s, piece in self.pipeline.take_chunks(states)]
        if on_progress is not None:
            on_progress(out.progress)
        # 4. Decode and drop the finished ones.
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
                out.metrics[rid] = self.pipeline.state_metrics(state)
                self._release(rid)
        return out

    def close(self) -> None:
        for rid in list(self.states):
            self._release(rid)

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

    def _update(self, out: RunnerOutput, updates: dict[str, list[dict]]) -> None:
        for rid, items in updates.items():
            state = self.states.get(rid)
            try:
                for update in items if state is not None else ():
                    self.pipeline.update_prompt(state, update)
            except Exception as exc:  # noqa: BLE001 - a bad update fails its request, not the batch
                self._fail(out, [rid], error_message(exc))

    def _add_previews(self, out: RunnerOutput, states: list[DenoiseState]) -> None:
        """Decode the current latents of the states at one of their preview steps: the first
        image of the payload, as a look at where the request is going."""
        due = [s for s in states if not s.is_done
               and s.step_index in preview_steps(s.num_steps, s.request.params.partial_images)]
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

    def _release(self, rid: str) -> None:
        state = self.states.pop(rid, None)
        if state is not None:
            self.pipeline.release(state)

    def _fail(self, out: RunnerOutput, req_ids: list[str], error: str) -> None:
        for rid in req_ids:
            out.errors[rid] = error
            self._release(rid)
