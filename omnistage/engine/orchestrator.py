"""Orchestrator: walks each request through the stage graph.

One `step()` reads like vLLM's `EngineCore.step`:

    _collect_inputs()    new requests and aborts from the inbox; entry stages get the prompt
    _admit_queued()      start the audio requests the real-time budget now has room for
    _dispatch()          hand the queued stage inputs to their stage handles
    then per stage, downstream first:
    _collect_outputs()   step it (inline: one engine step; process: read its pipe)
    _route(outputs)      chunks down streamed edges, whole payloads to stages whose inputs
                         are all in, deltas of final stages to the user
    _finish()            deliver the `OmniOutput`s so far to their requests' sinks

Hand-off per edge (both ends agree; `PipelineSpec` validates it):

- whole: a stage starts once all its inputs have finished; its input processor gets
  `{upstream id: whole payload}` (no processor: the payload itself, or the dict when
  there are several inputs). Entry stages get the prompt as given.
- streamed: the upstream's chunk processor maps each of its outputs to a partial payload
  (or None); each partial becomes one engine request `{request_id}#{n}` ("part") of the
  downstream stage, whose input processor gets `{upstream id: partial}`. So the
  downstream starts before the upstream ends. Outputs of part n are held until part n-1
  has finished, so the downstream's own stream stays in order; its whole payload joins
  the parts (`merge_payloads`). Into an AR stage the first partial starts one request
  `{request_id}` and every later one extends it (`InputChunk`): the sequence goes on
  from where its inputs have reached (Qwen2.5-Omni's talker following the thinker).

A request runs only the stages it needs (`needed_stages`): with `output_modalities` set, the
final stages making one of them and every stage upstream of those; the rest never see it.
It finishes when every final stage it runs has; its last `OmniOutput` carries the media of
all of them. A request making audio starts only while the real-time budget allows
(admission.py); until then it waits in `_queued`, in arrival order. Any stage error fails
only its request, naming the stage, and aborts the request everywhere else; `abort()` does
the same with finish_reason "abort".

Threads: `submit()` and `abort()` may be called from any thread (they post to an inbox
and wake the loop). Everything else runs on one thread: the loop `start()` runs, or a
caller driving `step()` itself (tests).
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import PipelineSpec, StageSpec
from omnistage.core.errors import EngineUnavailableError, ErrorKind, RequestError
from omnistage.core.playback import Playback
from omnistage.core.types import InputChunk, ProgressPayload, StageOutput, StageInputs, StageRequest
from omnistage.engine.admission import RealTimeAdmission
from omnistage.engine.factory import EngineFactory, create_engine, request_checker, stage_model_paths
from omnistage.engine.metrics import PrometheusMetrics, StageMetrics
from omnistage.engine.outputs import Delta, OmniOutput, StageStream, fill_media
from omnistage.engine.replicas import replicas_of
from omnistage.engine.stage_handle import StageHandle, make_stage_handle
from omnistage.runtime.channel import DEFAULT_THRESHOLD_BYTES
from omnistage.runtime.endpoint import Waker

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5  # longest sleep of an idle loop; any new request, abort or stage output wakes it
Sink = Callable[[OmniOutput], None]


@dataclass(frozen=True)
class OmniRequest:
    """A user request as the orchestrator holds it; what input and chunk processors receive."""

    request_id: str
    prompt: Any
    """As the user gave it: a str, a dict such as {"prompt": ..., "image": PIL}, or chat messages."""
    params: Mapping[int, Any] = field(default_factory=dict)
    """Params per stage id (DiffusionParams, SamplingParams, ...); a missing id = engine defaults."""
    arrival_time: float = field(default_factory=time.monotonic)
    output_modalities: tuple[str, ...] | None = None
    """Modalities the user wants, e.g. ("text",); only the stages making them run. None = every stage."""
    session_id: str | None = None
    """The conversation or session the request belongs to (e.g. chat's `user`): a stage with
    `routing_policy: affinity` sends a session's requests to the same replica."""


@dataclass
class _StageRun:
    """One request's progress through one stage."""

    stage: StageSpec
    upstream: dict[int, Any] = field(default_factory=dict)
    """Whole payloads of the inputs that have finished."""
    engine_ids: list[str] = field(default_factory=list)
    """Engine request ids sent, in order: one, or one per streamed chunk (part)."""
    num_parts_done: int = 0
    held: dict[int, list[StageOutput]] = field(default_factory=dict)
    """Outputs of parts that arrived before the parts ahead of them finished."""
    upstream_finished: bool = False
    """No more input will come (for a whole hand-off, as soon as the stage starts)."""
    finished: bool = False
    stream: StageStream = field(default_factory=StageStream)
    metrics: StageMetrics = field(default_factory=StageMetrics)

    @property
    def all_parts_done(self) -> bool:
        return self.upstream_finished and self.num_parts_done == len(self.engine_ids)


@dataclass
class _RequestState:
    request: OmniRequest
    runs: dict[int, _StageRun]
    """The stages the request runs (`Orchestrator.needed_stages`), in pipeline order."""
    final_pending: set[int]
    """Final stages that have not finished yet."""
    first_audio_time: float | None = None
    """When the first audio of a final stage went to the user (time to first audio packet)."""
    playback: Playback | None = None
    """A real-time player of the audio the request streams (the audio metrics' underruns)."""


class Orchestrator:
    def __init__(
        self,
        pipeline: PipelineSpec,
        model_path: str,
        stage_configs: Mapping[int, StageDeployConfig] | None = None,
        *,
        connector: str = "shm",
        shm_threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
        engine_factory: EngineFactory = create_engine,
        metrics_registry: Any = None,
        init_timeout_s: float = 600.0,
    ):
        """Start every stage's engine (inline, or in its own process) and wait until all are up.

        `model_path` is the checkpoint, or a pipeline folder holding one checkpoint per
        stage (see `factory.stage_model_paths`). `connector` carries payloads to and from process
        stages. `metrics_registry` is a prometheus_client `CollectorRegistry` to export
        into; None gives this orchestrator its own (`self.metrics_registry`). Each stage is
        supervised (runtime/supervisor.py) with its deploy fields' restart policy.
        """
        from prometheus_client import CollectorRegistry

        self.pipeline = pipeline
        self.model_path = str(model_path)
        configs = dict(stage_configs or {})
        self.stage_configs = {s.id: configs.get(s.id, StageDeployConfig()) for s in pipeline.stages}
        self._downstream = {s.id: pipeline.downstream_of(s.id) for s in pipeline.stages}
        self.metrics_registry = metrics_registry if metrics_registry is not None else CollectorRegistry()
        self.metrics = PrometheusMetrics(self.metrics_registry, pipeline.name)
        self.metrics.watch_audio_streams(self.audio_streams)
        self._admission, self._budget_stages = self._real_time_admission()
        self._queued: deque[tuple[OmniRequest, Sink | None]] = deque()  # waiting for the real-time budget
        if self._admission is not None:
            self.metrics.watch_admission(lambda: len(self._queued), lambda: self._admission.capacity)

        self._requests: dict[str, _RequestState] = {}
        self._sinks: dict[str, Sink] = {}
        self._engine_ids: dict[tuple[int, str], tuple[str, int]] = {}  # (stage, engine id) -> (request, part)
        self._to_dispatch: list[tuple[int, StageRequest]] = []
        self._outputs: list[OmniOutput] = []
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._waker = Waker()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # orders submit() against close(): no request slips in after the last drain
        self._closed = False
        self.fatal_error: str | None = None
        self._engine_factory = engine_factory
        self._checkers: dict[int, Callable[[StageRequest], None] | None] = {}  # built on first `check`
        self._held: list[tuple[OmniRequest, Sink | None]] | None = None  # kept back by hold(), until release()
        self.paused: str | None = None
        """Why new requests are refused now (the engine sleeps), or None while it admits them."""
        self.handles = self._start_stages(engine_factory, connector, shm_threshold_bytes, init_timeout_s)
        for stage in pipeline.stages:
            self.metrics.watch_replicas(stage.name, self.handles[stage.id])

    def _start_stages(self, factory: EngineFactory, connector: str, shm_threshold_bytes: int,
                      init_timeout_s: float) -> dict[int, StageHandle]:
        # Process and Ray stages first: they load in parallel while inline stages load here.
        token = secrets.token_hex(3)
        model_paths = stage_model_paths(self.model_path, self.pipeline)
        order = sorted(self.pipeline.stages, key=lambda s: self.stage_configs[s.id].runtime == "inline")
        handles: dict[int, StageHandle] = {}
        try:
            for stage in order:
                handles[stage.id] = make_stage_handle(
                    stage, self.stage_configs[stage.id], model_paths[stage.id], factory,
                    connector, shm_threshold_bytes, shm_prefix=f"os{token}{stage.id}")
            for handle in handles.values():
                handle.wait_ready(init_timeout_s)
        except BaseException:
            for handle in handles.values():
                handle.close()
            raise
        return {s.id: handles[s.id] for s in self.pipeline.stages}

    def _real_time_admission(self) -> tuple[RealTimeAdmission | None, frozenset[int]]:
        """The admission of the final stages streaming audio (fed in chunks as their upstream makes
        them) with `real_time_admission` (their ids). Audio made whole (a diffusion stage, a
        whole hand-off) has no real-time listener to keep ahead."""
        audio = {s.id for s in self.pipeline.final_stages if "audio" in s.modalities and s.stream_input}
        for stage in self.pipeline.stages:
            if self.stage_configs[stage.id].audio_capacity is not None and stage.id not in audio:
                raise ValueError(f"stage {stage.label}: audio_capacity is a field of a final stage streaming audio")
        ids = frozenset(i for i in audio if self.stage_configs[i].real_time_admission)
        if not ids:
            return None, ids
        fixed = [self.stage_configs[i].audio_capacity for i in sorted(ids) if self.stage_configs[i].audio_capacity]
        return RealTimeAdmission(min(fixed) if fixed else None), ids

    # --- called from any thread ------------------------------------------------------------

    def submit(self, request: OmniRequest, sink: Sink | None = None) -> None:
        """Queue `request`; `sink` gets each of its `OmniOutput`s on the loop's thread.

        Raises ValueError, queueing nothing, when the pipeline cannot make a requested modality,
        and EngineUnavailableError once the orchestrator is closed (or its loop crashed)."""
        self.needed_stages(request)
        with self._lock:
            if self._closed or self.fatal_error is not None:
                raise EngineUnavailableError(self.fatal_error or "the orchestrator is closed")
            if self.paused is not None:
                raise EngineUnavailableError(self.paused)
            self._inbox.put(("add", request, sink))
        self._wake()

    def abort(self, request_id: str) -> None:
        """Stop `request_id` in every stage; its sink gets a last output with finish_reason "abort"."""
        self._inbox.put(("abort", request_id, None))
        self._wake()

    def update(self, request_id: str, inputs: dict) -> None:
        """New inputs for running request `request_id`, sent as an `InputChunk` to its running
        diffusion stages (a prompt update, `{"event_id", "prompt", "transition_chunks"}`) and,
        in a full-duplex pipeline (`PipelineSpec.duplex`), to its entry AR stage (the next
        audio of a session); a request that has ended ignores it."""
        self._inbox.put(("update", request_id, inputs))
        self._wake()

    def needed_stages(self, request: OmniRequest) -> tuple[StageSpec, ...]:
        """The stages `request` runs, in pipeline order: every stage when it names no
        `output_modalities`, else the final stages making one of them and every stage they
        read from (walking the inputs back to the entry stages)."""
        wanted = request.output_modalities
        if wanted is None:
            return self.pipeline.stages
        finals = self.pipeline.final_stages
        makes = sorted({m for stage in finals for m in stage.modalities})
        missing = [m for m in wanted if m not in makes]
        if missing or not wanted:
            what = f"cannot make {', '.join(map(repr, missing))}" if missing else "got no modality"
            raise ValueError(f"output_modalities: pipeline {self.pipeline.name!r} {what}; "
                             f"it makes {', '.join(map(repr, makes))}")
        needed: set[int] = set()
        todo = [stage.id for stage in finals if set(stage.modalities) & set(wanted)]
        while todo:
            stage_id = todo.pop()
            if stage_id not in needed:
                needed.add(stage_id)
                todo.extend(self.pipeline.get_stage(stage_id).inputs)
        return tuple(s for s in self.pipeline.stages if s.id in needed)

    def check(self, request: OmniRequest) -> None:
        """Raise RequestError (a ValueError) naming the stage if an entry stage would refuse
        `request` on arrival: its engine's own request check, or a poison fingerprint; from
        any thread, queueing nothing. For work answered before it runs (a video job), so a
        refusal is a 400 and not a job that fails later. Stages fed by other stages, or by
        an input processor, are checked when their inputs exist, as before."""
        for stage in self.needed_stages(request):
            if stage.inputs or stage.input_processor is not None:
                continue
            stage_request = StageRequest(request.request_id, request.prompt, request.params.get(stage.id))
            refused = self.handles[stage.id].refusal(stage_request)
            if refused is not None:
                raise RequestError(None, f"stage {stage.label}: {refused}")
            checker = self._checker(stage)
            if checker is None:
                continue
            try:
                checker(stage_request)
            except ValueError as e:  # as the stage would answer: a 400 naming the stage and the field
                raise RequestError(getattr(e, "param", None), f"stage {stage.label}: {e}") from None

    def _checker(self, stage: StageSpec) -> Callable[[StageRequest], None] | None:
        if stage.id not in self._checkers:
            try:
                path = stage_model_paths(self.model_path, self.pipeline)[stage.id]
                checker = request_checker(self._engine_factory, path, stage, self.stage_configs[stage.id])
            except Exception:  # noqa: BLE001 - no early check then: the stage still checks on arrival
                logger.warning("stage %s: no request check before queueing", stage.label, exc_info=True)
                checker = None
            self._checkers[stage.id] = checker
        return self._checkers[stage.id]
    def pause(self, reason: str) -> threading.Event:
        """Refuse new requests from now on (`submit` raises EngineUnavailableError(reason)). The
        Event is set once the loop has taken in every request submitted before, so that
        `has_unfinished_requests()` then counts them all."""
        taken_in = threading.Event()
        with self._lock:
            self.paused = reason
            self._inbox.put(("barrier", taken_in, None))
        self._wake()
        return taken_in

    def resume(self) -> None:
        with self._lock:
            self.paused = None

    def hold(self) -> threading.Event:
        """Keep the requests submitted from now on queued, unstarted, until `release()` (a weight
        update waits for the running ones to finish; the new ones then start on the new weights).
        The Event is set once every request submitted before is taken in."""
        taken_in = threading.Event()
        self._inbox.put(("hold", taken_in, None))
        self._wake()
        return taken_in

    def release(self) -> None:
        """Start the requests `hold()` kept, in the order they came."""
        self._inbox.put(("release", None, None))
        self._wake()

    def call_stages(self, method: str, *args: Any) -> list[Future]:
        """`method(*args)` on every stage's engine (every replica's), from any thread."""
        return [handle.call(method, *args) for handle in self.handles.values()]

    def set_standing(self, method: str, *args: Any, stage_ids: tuple[int, ...] | None = None) -> None:
        """Every stage (of `stage_ids`, default all) rebuilt from now on gets `method(*args)` before
        it serves (until cleared)."""
        handles = [h for i, h in self.handles.items() if stage_ids is None or i in stage_ids]
        for replica in (r for handle in handles for r in replicas_of(handle)):
            replica.standing[method] = args

    def clear_standing(self, method: str, stage_ids: tuple[int, ...] | None = None) -> None:
        handles = [h for i, h in self.handles.items() if stage_ids is None or i in stage_ids]
        for replica in (r for handle in handles for r in replicas_of(handle)):
            replica.standing.pop(method, None)

    def check_health(self) -> bool:
        return (not self._closed and self.fatal_error is None
                and all(handle.is_healthy() for handle in self.handles.values()))

    def start(self) -> None:
        """Run `step()` in a background thread until `close()`."""
        self._thread = threading.Thread(target=self._run_loop, name="omnistage-orchestrator", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the loop, end every open request (its sink gets an error output) and stop the stages."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake()
        if self._thread is not None:
            self._thread.join()
        self._fail_all("the orchestrator was closed")
        for handle in self.handles.values():
            handle.close()
        self._waker.close()

    # --- the loop ----------------------------------------------------------------------------

    def step(self) -> list[OmniOutput]:
        self._collect_inputs()
        self._admit_queued()
        self._dispatch()
        delivered: list[OmniOutput] = []
        # Downstream stages first, each one's outputs routed and delivered before the next one steps:
        # inline stages share one thread, so a chunk routed to the last stage is voiced and its audio
        # sent before the stages upstream take another step (first audio waits for no more thinker
        # and talker steps). The stages' cadence is the same either way: what a stage sends reaches
        # its downstream stage at the next dispatch.
        for stage_id, handle in reversed(self.handles.items()):
            self._route(self._collect_outputs(stage_id, handle))
            delivered += self._finish()
        # A stream that ended in this step makes room now: left for the next step, a queued request
        # would wait out the idle loop's sleep (nothing else to do) before its first audio.
        self._admit_queued()
        return delivered

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests or self._queued)

    def _run_loop(self) -> None:
        try:
            while not self._closed:
                self.step()
                if not self._has_local_work():
                    self._wait_for_work(IDLE_WAIT_S)
        except BaseException as e:  # a bug here must not leave callers waiting forever
            logger.exception("orchestrator loop crashed")
            with self._lock:
                self.fatal_error = f"the orchestrator loop crashed: {type(e).__name__}: {e}"
            self._fail_all(self.fatal_error)

    def _has_local_work(self) -> bool:
        return bool(self._to_dispatch) or any(h.has_local_work() for h in self.handles.values())

    def _wait_for_work(self, timeout: float) -> None:
        objects = [self._waker] + [o for h in self.handles.values() for o in h.wait_objects()]
        multiprocessing.connection.wait(objects, timeout)

    def _wake(self) -> None:
        self._waker.wake()

    # --- 1. collect inputs -----------------------------------------------------------------

    def _collect_inputs(self) -> None:
        self._waker.drain()
        while True:
            try:
                kind, body, sink = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add" and self._held is not None:
                self._held.append((body, sink))
            elif kind == "add":
                self._queue_or_add(body, sink)
            elif kind == "abort":
                self._abort_request(body)
            elif kind == "update":
                self._update_request(body, sink)
            elif kind in ("barrier", "hold"):
                if kind == "hold" and self._held is None:
                    self._held = []
                body.set()
            elif kind == "release" and self._held is not None:
                held, self._held = self._held, None
                for request, held_sink in held:
                    self._queue_or_add(request, held_sink)

    def _queue_or_add(self, request: OmniRequest, sink: Sink | None) -> None:
        """Start `request`, or queue it behind the others waiting for the real-time budget."""
        if self._needs_budget(request) and (self._queued or not self._admits()):
            self._queued.append((request, sink))
            self.metrics.observe_audio_queued()
        else:
            self._add_request(request, sink)

    def _admit_queued(self) -> None:
        while self._queued and self._admits():
            self._add_request(*self._queued.popleft())

    def _needs_budget(self, request: OmniRequest) -> bool:
        if self._admission is None:
            return False
        try:
            return any(s.id in self._budget_stages for s in self.needed_stages(request))
        except ValueError:
            return False  # refused when it starts (_add_request answers it)

    def _admits(self) -> bool:
        """Whether one more audio stream fits the real-time budget now (admission.py)."""
        now = time.monotonic()
        streams = [state for state in self._requests.values()
                   if any(i in self._budget_stages and not run.finished for i, run in state.runs.items())]
        if not streams:
            self._admission.meter.idle()
        unstarted = sum(state.playback is None for state in streams)
        behind = sum(state.playback is not None and not state.playback.ahead(now) for state in streams)
        lead = min((state.playback.lead(now) for state in streams if state.playback is not None), default=0.0)
        return self._admission.admits(len(streams), unstarted, behind, lead)

    def _add_request(self, request: OmniRequest, sink: Sink | None) -> None:
        rid = request.request_id
        if rid in self._requests:
            error = OmniOutput(rid, finished=True, finish_reason="error", error=f"request_id {rid!r} is already running")
            _deliver(sink, error)
            return
        if sink is not None:
            self._sinks[rid] = sink
        stages = self.needed_stages(request)
        state = _RequestState(request, {s.id: _StageRun(s) for s in stages},
                              {s.id for s in stages if s.final_output})
        self._requests[rid] = state
        for stage in stages:
            if not stage.inputs and rid in self._requests:
                self._start_stage(state, stage)

    def _update_request(self, request_id: str, inputs: dict) -> None:
        state = self._requests.get(request_id)
        for run in state.runs.values() if state is not None else ():
            takes = run.stage.kind == "diffusion" or (self.pipeline.duplex is not None and not run.stage.inputs)
            if takes and request_id in run.engine_ids and not run.finished:
                self._to_dispatch.append((run.stage.id, StageRequest(request_id, InputChunk(inputs))))

    def _abort_request(self, request_id: str) -> None:
        state = self._requests.get(request_id)
        if state is None:
            for waiting_list in (self._held or [], self._queued):  # held back by `hold()`, or queued: never started
                waiting = next((item for item in waiting_list if item[0].request_id == request_id), None)
                if waiting is not None:
                    waiting_list.remove(waiting)
                    _deliver(waiting[1], OmniOutput(request_id, finished=True, finish_reason="abort"))
            return
        text = next((run.stream.text for run in state.runs.values()
                     if run.stage.final_output and run.stream.text is not None), None)
        self._outputs.append(OmniOutput(request_id, finished=True, text=text, finish_reason="abort",
                                        metrics=self._request_metrics(state)))
        self._retire(state, "abort")

    # --- 2. dispatch -----------------------------------------------------------------------

    def _start_stage(self, state: _RequestState, stage: StageSpec) -> None:
        """Whole hand-off (or an entry stage): every input is in; send the stage its one request."""
        run = state.runs[stage.id]
        run.upstream_finished = True
        ok, inputs = self._build_input(state, stage, run.upstream)
        if ok:
            self._send(state, run, inputs)

    def _build_input(self, state: _RequestState, stage: StageSpec, upstream: dict[int, Any]) -> tuple[bool, Any]:
        if stage.input_processor is not None:
            return self._call(state, stage, "input_processor", stage.input_processor, state.request, upstream)
        if not stage.inputs:
            return True, state.request.prompt
        return True, next(iter(upstream.values())) if len(upstream) == 1 else dict(upstream)

    def _send(self, state: _RequestState, run: _StageRun, inputs: Any) -> None:
        rid, part = state.request.request_id, len(run.engine_ids)
        fallback_params = None
        if isinstance(inputs, StageInputs):
            inputs, fallback_params = inputs.inputs, inputs.params
        if run.stage.stream_input and run.stage.kind == "ar" and run.engine_ids:
            # the AR stage's one request goes on: extend it (after its start, in dispatch order)
            self._to_dispatch.append((run.stage.id, StageRequest(rid, InputChunk(inputs))))
            return
        engine_id = f"{rid}#{part}" if run.stage.stream_input and run.stage.kind != "ar" else rid
        run.engine_ids.append(engine_id)
        self._engine_ids[(run.stage.id, engine_id)] = (rid, part)
        run.metrics.on_start(state.request.arrival_time if not run.stage.inputs else None)
        params = state.request.params.get(run.stage.id)
        if params is None:  # the processor's params stand in for missing user params
            params = fallback_params
        self._to_dispatch.append((run.stage.id, StageRequest(
            engine_id, inputs, params, session_id=state.request.session_id,
            stream_of=rid if engine_id != rid else None)))

    def _dispatch(self) -> None:
        pending, self._to_dispatch = self._to_dispatch, []
        for stage_id, request in pending:
            key = (stage_id, request.request_id)
            if key not in self._engine_ids:
                continue  # aborted since
            if not isinstance(request.inputs, InputChunk):
                self._requests[self._engine_ids[key][0]].runs[stage_id].metrics.on_dispatch()
            self.handles[stage_id].add_request(request)

    # --- 3. collect outputs ----------------------------------------------------------------

    def _collect_outputs(self, stage_id: int, handle: StageHandle) -> list[tuple[int, StageOutput]]:
        return [(stage_id, out) for out in handle.step()]

    # --- 4. route ----------------------------------------------------------------------------

    def _route(self, outputs: list[tuple[int, StageOutput]]) -> None:
        for stage_id, out in outputs:
            key = (stage_id, out.request_id)
            if key not in self._engine_ids:
                continue  # its request was aborted or failed
            rid, part = self._engine_ids[key]
            state = self._requests[rid]
            run = state.runs[stage_id]
            if out.error is not None:
                self._fail(state, run.stage, out.error, out.error_kind, out.error_param)
                continue
            if out.finished:
                del self._engine_ids[key]
            if part != run.num_parts_done:
                run.held.setdefault(part, []).append(out)
                continue
            self._on_part_output(state, run, out)
            while rid in self._requests and run.num_parts_done in run.held:
                for held in run.held.pop(run.num_parts_done):
                    if rid in self._requests:
                        self._on_part_output(state, run, held)

    def _on_part_output(self, state: _RequestState, run: _StageRun, out: StageOutput) -> None:
        run.metrics.on_output(out.payload, out.metrics, out.finished)
        if out.finished:
            run.num_parts_done += 1
        delta = run.stream.add(out.payload, out.finished)
        self._on_stage_output(state, run, out.payload, delta, finished=out.finished and run.all_parts_done)

    def _on_stage_output(self, state: _RequestState, run: _StageRun, payload: Any, delta: Delta,
                         finished: bool) -> None:
        """One output of a stage for a request, in order; `finished` = the stage is done with it."""
        stage, rid = run.stage, state.request.request_id
        run.finished = run.finished or finished
        downstreams = [s for s in self._downstream[stage.id] if s.id in state.runs]  # the ones this request runs
        # Streamed edges: every output may become a chunk for the downstream stages.
        if stage.chunk_processor is not None and downstreams and not isinstance(payload, ProgressPayload):
            if payload is not None or finished:
                ok, partial = self._call(state, stage, "chunk_processor", stage.chunk_processor,
                                         state.request, payload, finished)
                for downstream in downstreams:
                    if not ok or rid not in self._requests:
                        return
                    self._feed_chunk(state, state.runs[downstream.id], stage, partial, finished)
        # Whole edges: the finished payload goes to each stage whose inputs are now all in.
        if finished:
            for downstream in downstreams:
                if downstream.stream_input or rid not in self._requests:
                    continue
                downstream_run = state.runs[downstream.id]
                downstream_run.upstream[stage.id] = run.stream.whole()
                if len(downstream_run.upstream) == len(downstream.inputs):
                    self._start_stage(state, downstream)
        if rid in self._requests:
            self._emit(state, run, delta, finished)

    def _feed_chunk(self, state: _RequestState, run: _StageRun, upstream: StageSpec, partial: Any,
                    upstream_finished: bool) -> None:
        if partial is not None:
            ok, inputs = self._build_input(state, run.stage, {upstream.id: partial})
            if not ok:
                return
            self._send(state, run, inputs)
        if upstream_finished:
            run.upstream_finished = True
            if run.all_parts_done and not run.finished:  # its last part finished before the upstream did
                self._on_stage_output(state, run, None, Delta(), finished=True)

    def _emit(self, state: _RequestState, run: _StageRun, delta: Delta, finished: bool) -> None:
        stage, rid = run.stage, state.request.request_id
        if stage.final_output and delta.audio_chunk is not None:
            seconds = len(delta.audio_chunk) / delta.sample_rate if delta.sample_rate else 0.0
            self._on_audio(state, seconds)
            if stage.id in self._budget_stages:
                self._admission.meter.observe(seconds, time.monotonic())
        if stage.final_output and finished:
            state.final_pending.discard(stage.id)
            if not state.final_pending:
                self._complete(state, stage, delta)
                return
        if stage.final_output and not delta.is_empty:
            self._outputs.append(OmniOutput(
                rid, text=delta.text, text_delta=delta.text_delta, logprobs_delta=delta.logprobs,
                audio_chunk=delta.audio_chunk, video_chunk=delta.video_chunk,
                sample_rate=delta.sample_rate, progress=delta.progress, stage=stage.name))
        elif delta.progress is not None:  # every stage's progress is worth showing
            self._outputs.append(OmniOutput(rid, progress=delta.progress, stage=stage.name))

    def _complete(self, state: _RequestState, last_stage: StageSpec, delta: Delta) -> None:
        out = OmniOutput(state.request.request_id, finished=True, stage=last_stage.name,
                         text_delta=delta.text_delta, logprobs_delta=delta.logprobs, audio_chunk=delta.audio_chunk)
        for run in state.runs.values():
            if run.stage.final_output:
                fill_media(out, run.stream.whole())
        out.finish_reason = out.finish_reason or "stop"
        out.metrics = self._request_metrics(state)
        if out.audio is not None and out.sample_rate:
            self._add_audio_metrics(state, out)
        self._outputs.append(out)
        self._retire(state, "finished")

    # --- 5. finish -------------------------------------------------------------------------

    def _finish(self) -> list[OmniOutput]:
        outputs, self._outputs = self._outputs, []
        for out in outputs:
            sink = self._sinks.pop(out.request_id, None) if out.finished else self._sinks.get(out.request_id)
            _deliver(sink, out)
        self.metrics.set_num_running(len(self._requests))
        return outputs

    # --- failures and bookkeeping ------------------------------------------------------------

    def _call(self, state: _RequestState, stage: StageSpec, what: str, fn: Callable, *args: Any) -> tuple[bool, Any]:
        """Run a model's processor; if it raises, fail the request naming the stage."""
        try:
            return True, fn(*args)
        except RequestError as e:  # the request's inputs, not the processor: a 400 naming the field
            self._fail(state, stage, f"{what}: {e.message}", ErrorKind.INVALID_REQUEST, e.param)
            return False, None
        except Exception as e:
            logger.exception("stage %s: %s failed for request %s", stage.label, what, state.request.request_id)
            self._fail(state, stage, f"{what} raised {type(e).__name__}: {e}")
            return False, None

    def _fail(self, state: _RequestState, stage: StageSpec, message: str, kind: ErrorKind | None = None,
              param: str | None = None) -> None:
        self.metrics.observe_stage_error(stage.name)
        self._outputs.append(OmniOutput(
            state.request.request_id, finished=True, finish_reason="error", stage=stage.name,
            error=f"stage {stage.label}: {message}", error_kind=kind, error_param=param,
            metrics=self._request_metrics(state)))
        self._retire(state, "error")

    def _fail_all(self, reason: str) -> None:
        """End every request, queued ones included (close, or a crashed loop)."""
        while True:
            try:
                kind, body, sink = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                _deliver(sink, OmniOutput(body.request_id, finished=True, finish_reason="error", error=reason,
                                          error_kind=ErrorKind.UNAVAILABLE))
            elif kind in ("barrier", "hold"):
                body.set()
        held, self._held = [*(self._held or []), *self._queued], None
        self._queued.clear()
        for request, sink in held:
            _deliver(sink, OmniOutput(request.request_id, finished=True, finish_reason="error", error=reason,
                                      error_kind=ErrorKind.UNAVAILABLE))
        for state in list(self._requests.values()):
            self._outputs.append(OmniOutput(state.request.request_id, finished=True, finish_reason="error",
                                            error=reason, error_kind=ErrorKind.UNAVAILABLE, metrics=self._request_metrics(state)))
            try:
                self._retire(state, "error")
            except Exception:  # after a crashed loop the bookkeeping may be broken; answer anyway
                logger.exception("retiring request %s failed", state.request.request_id)
                self._requests.pop(state.request.request_id, None)
        self._finish()

    def _retire(self, state: _RequestState, status: str) -> None:
        """Forget a request: abort what is still running for it, record its metrics."""
        for run in state.runs.values():
            in_flight = False
            for engine_id in run.engine_ids:
                if self._engine_ids.pop((run.stage.id, engine_id), None) is not None:
                    self.handles[run.stage.id].abort_request(engine_id)
                    in_flight = True
            parts = run.stage.stream_input and run.stage.kind != "ar"  # one engine request per chunk (_send)
            if parts and run.engine_ids and not run.finished and not in_flight:
                # no part in flight, but the stage may hold the stream's state between parts: end it
                self.handles[run.stage.id].abort_stream(state.request.request_id)
            if run.finished:
                self.metrics.observe_stage(run.stage.name, run.metrics.as_dict())
        del self._requests[state.request.request_id]
        self.metrics.observe_request(status, time.monotonic() - state.request.arrival_time)

    def _request_metrics(self, state: _RequestState) -> dict[str, Any]:
        """End-to-end time, the prompt's token count (as the entry stages tokenized it), per-stage metrics."""
        prompt_tokens = [run.metrics.engine.get("num_prompt_tokens")
                         for run in state.runs.values() if not run.stage.inputs]
        prompt_tokens = [n for n in prompt_tokens if n is not None]
        return {
            "e2e_time": time.monotonic() - state.request.arrival_time,
            "num_prompt_tokens": sum(prompt_tokens) if prompt_tokens else None,
            "stages": {run.stage.name: run.metrics.as_dict()
                       for run in state.runs.values() if run.metrics.start_time is not None},
        }

    def _on_audio(self, state: _RequestState, seconds: float) -> None:
        now = time.monotonic()
        if state.playback is None:
            state.first_audio_time = now
            state.playback = Playback()
        self.metrics.observe_audio_chunk(seconds, state.playback.receive(seconds, now))

    def audio_streams(self) -> dict[str, int]:
        """Requests streaming audio now, by whether a real-time player of each still has audio to
        play ("ahead") or waits on the next chunk ("behind"); read from any thread."""
        now, counts = time.monotonic(), {"ahead": 0, "behind": 0}
        for state in list(self._requests.values()):
            if state.playback is not None:
                counts["ahead" if state.playback.ahead(now) else "behind"] += 1
        return counts

    def _add_audio_metrics(self, state: _RequestState, out: OmniOutput) -> None:
        """Time to first audio packet and real-time factor (e2e time / audio duration)."""
        audio_seconds = len(out.audio) / out.sample_rate
        first = state.first_audio_time
        ttfp = None if first is None else first - state.request.arrival_time
        rtf = out.metrics["e2e_time"] / audio_seconds if audio_seconds > 0 else None
        out.metrics.update(time_to_first_audio=ttfp, audio_seconds=audio_seconds, real_time_factor=rtf)
        self.metrics.observe_audio(ttfp, rtf)


def _deliver(sink: Sink | None, out: OmniOutput) -> None:
    if sink is None:
        return
    try:
        sink(out)
    except Exception:  # a consumer that went away must not take the loop down
        logger.exception("delivering an output of request %s failed", out.request_id)
