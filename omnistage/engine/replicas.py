"""Replica sets: several supervised copies of one stage behind one stage handle.

A stage with `num_replicas: N` (N > 1) is a `ReplicaSet` of N `Supervisor`s, one per copy
(a process or a Ray actor each). The orchestrator drives it exactly like one supervisor;
the set only decides where requests go:

- a new request goes to a serving replica picked by the stage's `routing_policy`
  (routing.py); the streamed input of a request that is running (an `InputChunk`) goes to
  the replica that holds it, and the parts of one streamed input (`stream_of`) all go to
  one replica, picked by their request (a decoder keeps a stream's state between parts);
- an abort goes to every replica (only the holder has it, the others ignore it);
- when a replica dies from outside (killed, hung, its node lost), the requests it held that
  had sent no output yet (its supervisor's `orphans`) are re-run on another serving replica, and their "unavailable" errors are
  swallowed: the caller sees one answer. A request that had sent output already keeps the
  error (a 503), since a re-run would repeat what it sent. With no other replica serving,
  every error goes up as it would for one copy.

Liveness, restarts, hang detection and poison refusal stay in each replica's supervisor
(the replicas share one crash table); the set tracks no request itself: who holds what is
read from the supervisors' `held`.

With an `Autoscaler` (deploy `max_replicas`; autoscaling.py) the set also grows and shrinks:
a new copy is built in a background thread and joins at the next step once it is ready (with
the standing calls the others have, e.g. "sleep"); a copy to remove is first *draining*: it
takes no new request (nor a re-run), steps until it holds none, then is closed and leaves.
`replicas` is replaced, never changed in place, so other threads (health, metrics, control
calls) read a consistent list.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from omnistage.core.errors import ErrorKind
from omnistage.core.types import InputChunk, StageOutput, StageRequest
from omnistage.engine.autoscaling import Autoscaler
from omnistage.engine.routing import RoutingPolicy, by_key
from omnistage.runtime.endpoint import Waker
from omnistage.runtime.supervisor import CLOSE_TIMEOUT_S, Supervisor

logger = logging.getLogger(__name__)

REPLICA_STATES = ("serving", "hung", "restarting", "down", "draining", "starting")
START_RETRY_S = 30.0
"""After a copy failed to start, the autoscaler waits this long before it tries another."""


class ReplicaSet:
    def __init__(self, label: str, replicas: Sequence[Supervisor], policy: RoutingPolicy,
                 on_close: Callable[[], None] | None = None, *,
                 make_replica: Callable[[int], Supervisor] | None = None, autoscaler: Autoscaler | None = None):
        """`on_close` runs after the replicas are closed (it frees what they shared: a Ray
        placement group). `make_replica(index)` builds copy `index` (its endpoint started, not
        yet ready); the `autoscaler` uses it to add copies."""
        self.label = label
        self.replicas = list(replicas)
        self.policy = policy
        self._on_close = on_close
        self.num_reruns = 0
        """Requests re-run on another replica after theirs died."""
        self.autoscaler = autoscaler
        self.draining: list[Supervisor] = []
        """Copies on their way out (still in `replicas` until they hold nothing)."""
        self.index = {replica: i for i, replica in enumerate(self.replicas)}
        """Each copy's number, kept for its life (labels, metrics, shared-memory names)."""
        self.watchers: list[Callable[[int, Supervisor | None], None]] = []
        """Told of each copy that joins (index, supervisor) or leaves (index, None)."""
        self.num_scale_ups = 0
        self.num_scale_downs = 0
        self._make_replica = make_replica
        self._next_index = len(self.replicas)
        self._lock = threading.Lock()  # guards _building and _started (start threads post to them)
        self._building: list[Supervisor] = []
        self._started: list[tuple[int, Supervisor | None]] = []  # None: it failed to start
        self.num_starting = 0
        self._no_start_until = 0.0
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._waker = Waker()  # a copy that is ready wakes the orchestrator to adopt it
        self._init_timeout_s = 600.0

    def wait_ready(self, timeout: float) -> None:
        self._init_timeout_s = timeout
        for replica in self.replicas:
            replica.wait_ready(timeout)

    # -- requests ------------------------------------------------------------------------

    def add_request(self, request: StageRequest) -> None:
        if isinstance(request.inputs, InputChunk):
            holder = next((r for r in self.replicas if request.request_id in r.held), None)
            if holder is not None:
                holder.add_request(request)
                return
        self._route(request).add_request(request)

    def refusal(self, request: StageRequest) -> str | None:
        """Why every replica would refuse `request` as poison: they share one crash table."""
        return self.replicas[0].refusal(request)

    def abort_request(self, request_id: str) -> None:
        for replica in self.replicas:
            replica.abort_request(request_id)

    def abort_stream(self, stream_id: str) -> None:
        for replica in self.replicas:
            replica.abort_stream(stream_id)

    def call(self, method: str, *args: Any) -> Future:
        """`method(*args)` on every replica; a Future of their replies in replica order, or of
        the first failure."""
        futures = [replica.call(method, *args) for replica in self.replicas]
        combined: Future = Future()
        lock = threading.Lock()  # replies resolve on any thread; only the last one answers

        def on_done(_: Future) -> None:
            with lock:
                if combined.done() or not all(f.done() for f in futures):
                    return
                failed = next((f.exception() for f in futures if f.exception() is not None), None)
                if failed is not None:
                    combined.set_exception(failed)
                else:
                    combined.set_result([f.result() for f in futures])

        for future in futures:
            future.add_done_callback(on_done)
        return combined

    def _serving(self, exclude: Supervisor | None = None) -> list[tuple[int, Supervisor]]:
        """(index, copy) of the copies that take requests. Policies see each copy's own index, not
        its place in the list, so affinity keys stay put when autoscaling adds or removes a copy."""
        return [(self.index[r], r) for r in self.replicas
                if r is not exclude and r not in self.draining and r.is_healthy()]

    def _with_index(self, index: int) -> Supervisor:
        return next(r for r in self.replicas if self.index[r] == index)

    def _route(self, request: StageRequest) -> Supervisor:
        serving = self._serving()
        if not serving:  # every copy is down: the first one answers "unavailable" (a 503)
            return self.replicas[0]
        if request.stream_of is not None:
            # The copy holding a part of this stream keeps it, even while it drains (its decoder has the state).
            holder = next((r for r in self.replicas if r.is_healthy()
                           and any(h.request.stream_of == request.stream_of for h in r.held.values())), None)
            return holder or self._with_index(by_key(serving, f"stream:{request.stream_of}"))
        return self._with_index(self.policy.pick(serving, request))

    # -- the orchestrator's step ---------------------------------------------------------

    def step(self) -> list[StageOutput]:
        self._waker.drain()
        self._adopt_started()
        outputs = []
        for replica in self.replicas:
            for out in replica.step():
                orphan = replica.orphans.get(out.request_id) if out.error_kind is ErrorKind.UNAVAILABLE else None
                if orphan is not None and self._rerun(replica, orphan):
                    continue
                outputs.append(out)
        self._retire_drained()
        if self.autoscaler is not None:
            self._autoscale()
        return outputs

    def _rerun(self, dead: Supervisor, request: StageRequest) -> bool:
        serving = self._serving(exclude=dead)
        if not serving:
            return False
        target = self._with_index(self.policy.pick(serving, request))
        logger.warning("stage %s: re-running request %s on %s after %s died", self.label, request.request_id,
                       target.label, dead.label)
        self.num_reruns += 1
        target.add_request(request)
        return True

    # -- autoscaling ---------------------------------------------------------------------

    def _autoscale(self) -> None:
        members = [r for r in self.replicas if r not in self.draining]
        num_replicas = len(members) + self.num_starting
        num_outstanding = sum(len(r.held) for r in self.replicas)
        wanted = self.autoscaler.decide(num_outstanding, num_replicas)
        for _ in range(wanted - num_replicas):
            if self.draining:  # the work came back: keep a copy that is still up before building one
                kept = max(self.draining, key=lambda r: len(r.held))
                self.draining = [r for r in self.draining if r is not kept]
                logger.info("stage %s: copy %d serves again (%d outstanding)", self.label, self.index[kept],
                            num_outstanding)
            elif time.monotonic() >= self._no_start_until:
                self._start_replica(num_outstanding)
        if wanted < num_replicas and members and not self.num_starting:  # the copies starting join first
            # The copy holding least (one not serving first, then the newest) finishes soonest.
            victim = min(members, key=lambda r: (r.is_healthy(), len(r.held), -self.index[r]))
            self.draining = self.draining + [victim]
            self.num_scale_downs += 1
            logger.info("stage %s: draining copy %d (%d outstanding over %d copies)", self.label, self.index[victim],
                        num_outstanding, num_replicas)

    def _start_replica(self, num_outstanding: int) -> None:
        index, self._next_index = self._next_index, self._next_index + 1
        self.num_starting += 1
        self.num_scale_ups += 1
        logger.info("stage %s: starting copy %d (%d outstanding)", self.label, index, num_outstanding)
        thread = threading.Thread(target=self._build, args=(index,), name=f"omnistage-scale-{self.label}-{index}",
                                  daemon=True)
        self._threads.append(thread)
        thread.start()

    def _build(self, index: int) -> None:
        """A start thread: build copy `index`, wait until it is ready, hand it to the next step."""
        replica = None
        try:
            replica = self._make_replica(index)
            with self._lock:
                closed = self._closed
                if not closed:
                    self._building.append(replica)  # close() closes it from here on
            if closed:
                replica.close()
                return
            replica.wait_ready(self._init_timeout_s)
            ready = True
        except Exception:
            logger.exception("stage %s: copy %d failed to start", self.label, index)
            ready = False
        with self._lock:
            owned = replica is not None and replica in self._building
            if owned:
                self._building.remove(replica)
            if not self._closed:
                self._started.append((index, replica if ready else None))
        if owned and (self._closed or not ready):
            replica.close()
        self._waker.wake()

    def _adopt_started(self) -> None:
        with self._lock:
            started, self._started = self._started, []
        for index, replica in started:
            self.num_starting -= 1
            if replica is None:
                self._no_start_until = time.monotonic() + START_RETRY_S
                continue
            if self.replicas:  # a copy joining a sleeping stage sleeps too
                replica.adopt_standing(self.replicas[0].standing)
            self.index = {**self.index, replica: index}
            self.replicas = self.replicas + [replica]
            for watch in self.watchers:
                watch(index, replica)
            logger.info("stage %s: copy %d joined (%d copies)", self.label, index, len(self.replicas))

    def _retire_drained(self) -> None:
        for replica in [r for r in self.draining if not r.held and not r.has_local_work()]:
            self.draining = [r for r in self.draining if r is not replica]
            self.replicas = [r for r in self.replicas if r is not replica]
            index = self.index[replica]
            for watch in self.watchers:
                watch(index, None)
            logger.info("stage %s: copy %d drained, stopping it (%d copies)", self.label, index,
                        len(self.replicas))
            # Closing waits for the process to exit: not on the orchestrator's thread.
            thread = threading.Thread(target=replica.close, name=f"omnistage-stop-{replica.label}", daemon=True)
            self._threads.append(thread)
            thread.start()

    # -- health and the orchestrator's wait -----------------------------------------------

    def is_healthy(self) -> bool:
        """The stage serves while at least one of its replicas does."""
        return any(replica.is_healthy() for replica in self.replicas)

    @property
    def num_restarts(self) -> int:
        return sum(replica.num_restarts for replica in self.replicas)

    def has_local_work(self) -> bool:
        return any(replica.has_local_work() for replica in self.replicas)

    def wait_objects(self) -> list[Any]:
        return [self._waker] + [o for replica in self.replicas for o in replica.wait_objects()]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            building, self._building = self._building, []
        for replica in self.replicas + building:  # closing one that is starting ends its wait_ready
            replica.close()
        for thread in self._threads:
            thread.join(CLOSE_TIMEOUT_S)
        self._waker.close()
        if self._on_close is not None:
            self._on_close()


def replicas_of(handle: Supervisor | ReplicaSet) -> list[Supervisor]:
    """A stage handle's copies: a replica set's replicas, or the one supervisor."""
    return handle.replicas if isinstance(handle, ReplicaSet) else [handle]


def count_states(handle: Supervisor | ReplicaSet) -> dict[str, int]:
    """A stage's copies by state; a draining copy counts as "draining", whatever its supervisor's state."""
    counts = dict.fromkeys(REPLICA_STATES, 0)
    draining = handle.draining if isinstance(handle, ReplicaSet) else []
    for replica in replicas_of(handle):
        counts["draining" if replica in draining else replica.state] += 1
    if isinstance(handle, ReplicaSet):
        counts["starting"] = handle.num_starting
    return counts
