"""Per-request, per-stage metrics, and their Prometheus export.

`StageMetrics` is what one request spent in one stage. The orchestrator observes when
the stage's input was ready, when it reached the engine, the first output and the last;
the engine reports the rest in
`StageOutput.metrics` (both engines use `queue_time`, `run_time` in seconds, `num_steps`,
`num_generated_tokens`; any other key, such as the diffusion seed, is passed through).
`OmniOutput.metrics["stages"]` carries them as plain dicts: durations in seconds, and
`start_time` / `first_output_time` / `finish_time` on the `time.monotonic()` clock, so
stage timelines of one request can be compared.

`PrometheusMetrics` writes into a `CollectorRegistry` given by the owner (the server's
registry, or a fresh one per orchestrator), never into prometheus_client's global one,
so two orchestrators in one process (tests, a server and a benchmark) never collide.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from omnistage.core.types import ProgressPayload, TextPayload
from omnistage.engine.replicas import REPLICA_STATES, ReplicaSet, count_states, replicas_of


# From a token (ms) to a video (minutes).
TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, float("inf"))
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, float("inf"))
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, float("inf"))


@dataclass
class StageMetrics:
    start_time: float | None = None
    """When the stage's input was ready (for an entry stage, when the request arrived)."""
    dispatch_time: float | None = None
    """When the orchestrator handed the (first) input to the stage's engine."""
    first_output_time: float | None = None
    finish_time: float | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    """What the engine reported on its first finished output for this request."""
    num_parts: int = 0
    """Finished engine requests: 1, or one per streamed chunk."""
    num_text_tokens: int = 0
    num_progress_steps: int = 0

    def on_start(self, ready_time: float | None = None) -> None:
        if self.start_time is None:
            self.start_time = ready_time if ready_time is not None else time.monotonic()

    def on_dispatch(self) -> None:
        if self.dispatch_time is None:
            self.dispatch_time = time.monotonic()

    def on_output(self, payload: Any, engine_metrics: dict[str, Any], part_finished: bool) -> None:
        now = time.monotonic()
        if self.first_output_time is None:
            self.first_output_time = now
        if isinstance(payload, ProgressPayload):
            self.num_progress_steps = max(self.num_progress_steps, payload.step)
        if part_finished:
            self.finish_time = now
            self.num_parts += 1
            if isinstance(payload, TextPayload):
                self.num_text_tokens += len(payload.token_ids)
            for key, value in engine_metrics.items():
                self.engine.setdefault(key, value)

    @property
    def queue_time(self) -> float | None:
        """Waiting before the engine ran it: in the orchestrator, then in the engine's scheduler."""
        waited = _elapsed(self.start_time, self.dispatch_time)
        if waited is None:
            return None
        return waited + self.engine.get("queue_time", 0.0)

    def as_dict(self) -> dict[str, Any]:
        queue_time = self.queue_time
        if self.num_parts == 1 and "run_time" in self.engine:
            run_time = self.engine["run_time"]
        else:
            total = _elapsed(self.start_time, self.finish_time)
            run_time = None if total is None else total - (queue_time or 0.0)
        return {
            **self.engine,
            "start_time": self.start_time,
            "first_output_time": self.first_output_time,
            "finish_time": self.finish_time,
            "queue_time": queue_time,
            "run_time": run_time,
            "time_to_first_output": _elapsed(self.start_time, self.first_output_time),
            "num_tokens": self.engine.get("num_generated_tokens", self.num_text_tokens or None),
            "num_steps": self.engine.get("num_steps", self.num_progress_steps or None),
        }


def _elapsed(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


class PrometheusMetrics:
    """Orchestrator metrics, labelled by pipeline and stage, in the given registry."""

    def __init__(self, registry: Any, pipeline: str):
        from prometheus_client import Counter, Gauge, Histogram

        self.registry = registry
        self.pipeline = pipeline
        stage = ["pipeline", "stage"]
        self.queue_time = Histogram(
            "omnistage_stage_queue_time_seconds", "Time a request waited before a stage ran it.",
            stage, registry=registry, buckets=TIME_BUCKETS)
        self.run_time = Histogram(
            "omnistage_stage_run_time_seconds", "Time a stage spent on a request, queue time excluded.",
            stage, registry=registry, buckets=TIME_BUCKETS)
        self.time_to_first_output = Histogram(
            "omnistage_stage_time_to_first_output_seconds", "From a stage's input being ready to its first output.",
            stage, registry=registry, buckets=TIME_BUCKETS)
        self.batch_size = Histogram(
            "omnistage_stage_batch_size", "Mean size of the batches a stage ran a request in (engines that "
            "report it).", stage, registry=registry, buckets=BATCH_BUCKETS)
        self.tokens = Counter("omnistage_stage_tokens", "Tokens a stage generated.", stage, registry=registry)
        self.steps = Counter("omnistage_stage_steps", "Denoising steps a stage ran.", stage, registry=registry)
        self.forwards_computed = Counter(
            "omnistage_stage_transformer_forwards_computed", "Diffusion transformer forwards computed (one per "
            "CFG branch per step).", stage, registry=registry)
        self.forwards_skipped = Counter(
            "omnistage_stage_transformer_forwards_skipped", "Diffusion transformer forwards a step cache "
            "skipped.", stage, registry=registry)
        self.stage_errors = Counter(
            "omnistage_stage_errors", "Requests a stage failed.", stage, registry=registry)
        self.requests = Counter(
            "omnistage_requests", "Requests that ended, by how they ended.", ["pipeline", "status"],
            registry=registry)
        self.e2e_time = Histogram(
            "omnistage_request_e2e_time_seconds", "From arrival to the last output.", ["pipeline"],
            registry=registry, buckets=TIME_BUCKETS)
        self.time_to_first_audio = Histogram(
            "omnistage_request_time_to_first_audio_seconds",
            "From arrival to the first audio sent to the user (TTFP), for requests with audio output.",
            ["pipeline"], registry=registry, buckets=TIME_BUCKETS)
        self.real_time_factor = Histogram(
            "omnistage_request_real_time_factor", "End-to-end time / seconds of audio produced (RTF; < 1 is "
            "faster than real time).", ["pipeline"], registry=registry, buckets=RTF_BUCKETS)
        self.audio_seconds = Counter(
            "omnistage_audio_seconds", "Seconds of audio the final stages sent to users (its rate is the audio "
            "made per wall second).", ["pipeline"], registry=registry)
        self.audio_streams = Gauge(
            "omnistage_audio_streams", "Requests streaming audio now, by whether a player that started at their "
            "first audio and plays in real time still has audio (ahead) or waits for the next chunk (behind).",
            ["pipeline", "state"], registry=registry)
        self.audio_underruns = Counter(
            "omnistage_audio_underruns", "Times such a player ran out of audio before the next chunk came.",
            ["pipeline"], registry=registry)
        self.audio_underrun_time = Histogram(
            "omnistage_audio_underrun_seconds", "How long each of those stalls lasted.", ["pipeline"],
            registry=registry, buckets=TIME_BUCKETS)
        self.audio_waiting = Gauge(
            "omnistage_audio_requests_waiting", "Requests making audio that wait now for the real-time budget before "
            "they start.", ["pipeline"], registry=registry)
        self.audio_queued = Counter(
            "omnistage_audio_requests_queued", "Requests making audio that had to wait for the real-time budget "
            "(their wait is in omnistage_stage_queue_time_seconds of the entry stages).", ["pipeline"],
            registry=registry)
        self.audio_capacity = Gauge(
            "omnistage_audio_capacity", "Seconds of audio the final stages make per wall second, as the real-time "
            "admission measured it (or its audio_capacity); 0 before it has measured any.", ["pipeline"],
            registry=registry)
        self.num_running = Gauge(
            "omnistage_requests_running", "Requests in the orchestrator.", ["pipeline"], registry=registry)
        self.replicas = Gauge(
            "omnistage_stage_replicas", "Copies of a stage by state: serving, hung, restarting, down (gave up), "
            "draining, starting (autoscaling).",
            ["pipeline", "stage", "state"], registry=registry)
        self.reruns = Gauge(
            "omnistage_stage_replica_reruns", "Requests re-run on another replica after theirs died.", stage,
            registry=registry)
        self.outstanding = Gauge(
            "omnistage_stage_replica_outstanding", "Requests queued or running on each copy of a stage.",
            ["pipeline", "stage", "replica"], registry=registry)

    def watch_replicas(self, stage_name: str, handle: Any) -> None:
        """Export a stage handle's replicas by state, read when scraped (no loop keeps them)."""
        for state in REPLICA_STATES:
            self.replicas.labels(self.pipeline, stage_name, state).set_function(
                lambda state=state: count_states(handle)[state])
        self.reruns.labels(self.pipeline, stage_name).set_function(lambda: getattr(handle, "num_reruns", 0))

        def watch(index: int, replica: Any) -> None:
            if replica is None:  # a copy that left (autoscaling drained it)
                self.outstanding.remove(self.pipeline, stage_name, str(index))
            else:
                self.outstanding.labels(self.pipeline, stage_name, str(index)).set_function(lambda: len(replica.held))

        for i, replica in enumerate(replicas_of(handle)):
            watch(i, replica)
        if isinstance(handle, ReplicaSet):
            handle.watchers.append(watch)

    def observe_stage(self, stage_name: str, metrics: dict[str, Any]) -> None:
        """Record one request's `StageMetrics.as_dict()` for one stage."""
        labels = (self.pipeline, stage_name)
        for histogram, key in ((self.queue_time, "queue_time"), (self.run_time, "run_time"),
                               (self.time_to_first_output, "time_to_first_output")):
            if metrics.get(key) is not None:
                histogram.labels(*labels).observe(metrics[key])
        if metrics.get("batch_size") is not None:
            self.batch_size.labels(*labels).observe(metrics["batch_size"])
        if metrics.get("num_tokens"):
            self.tokens.labels(*labels).inc(metrics["num_tokens"])
        if metrics.get("num_steps"):
            self.steps.labels(*labels).inc(metrics["num_steps"])
        for counter, key in ((self.forwards_computed, "num_forwards_computed"),
                             (self.forwards_skipped, "num_forwards_skipped")):
            if metrics.get(key) is not None:
                counter.labels(*labels).inc(metrics[key])

    def observe_stage_error(self, stage_name: str) -> None:
        self.stage_errors.labels(self.pipeline, stage_name).inc()

    def observe_request(self, status: str, e2e_time_s: float) -> None:
        self.requests.labels(self.pipeline, status).inc()
        self.e2e_time.labels(self.pipeline).observe(e2e_time_s)

    def observe_audio(self, time_to_first_audio: float | None, real_time_factor: float | None) -> None:
        if time_to_first_audio is not None:
            self.time_to_first_audio.labels(self.pipeline).observe(time_to_first_audio)
        if real_time_factor is not None:
            self.real_time_factor.labels(self.pipeline).observe(real_time_factor)

    def observe_audio_chunk(self, seconds: float, stall: float) -> None:
        """A final stage sent `seconds` of audio; `stall` > 0: the request's player had run out that long."""
        self.audio_seconds.labels(self.pipeline).inc(seconds)
        if stall > 0:
            self.audio_underruns.labels(self.pipeline).inc()
            self.audio_underrun_time.labels(self.pipeline).observe(stall)

    def watch_audio_streams(self, count: Any) -> None:
        """Export `count()` ({"ahead": n, "behind": m}), read when scraped."""
        for state in ("ahead", "behind"):
            self.audio_streams.labels(self.pipeline, state).set_function(lambda state=state: count()[state])

    def watch_admission(self, num_waiting: Any, capacity: Any) -> None:
        """Export the real-time admission's queue length and capacity (callables), read when scraped."""
        self.audio_waiting.labels(self.pipeline).set_function(num_waiting)
        self.audio_capacity.labels(self.pipeline).set_function(lambda: capacity() or 0.0)

    def observe_audio_queued(self) -> None:
        self.audio_queued.labels(self.pipeline).inc()

    def set_num_running(self, num: int) -> None:
        self.num_running.labels(self.pipeline).set(num)
