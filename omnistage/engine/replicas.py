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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from omnistage.core.errors import ErrorKind
from omnistage.core.types import InputChunk, StageOutput, StageRequest
from omnistage.engine.routing import RoutingPolicy, by_key
from omnistage.runtime.supervisor import Supervisor

logger = logging.getLogger(__name__)

REPLICA_STATES = ("serving", "hung", "restarting", "down")


class ReplicaSet:
    def __init__(self, label: str, replicas: Sequence[Supervisor], policy: RoutingPolicy,
                 on_close: Callable[[], None] | None = None):
        """`on_close` runs after the replicas are closed (it frees what they shared: a Ray
        placement group)."""
        self.label = label
        self.replicas = list(replicas)
        self.policy = policy
        self._on_close = on_close
        self.num_reruns = 0
        """Requests re-run on another replica after theirs died."""

    def wait_ready(self, timeout: float) -> None:
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
        return [(i, r) for i, r in enumerate(self.replicas) if r is not exclude and r.is_healthy()]

    def _route(self, request: StageRequest) -> Supervisor:
        serving = self._serving()
        if not serving:  # every copy is down: the first one answers "unavailable" (a 503)
            return self.replicas[0]
        if request.stream_of is not None:
            return self.replicas[by_key(serving, f"stream:{request.stream_of}")]
        return self.replicas[self.policy.pick(serving, request)]

    # -- the orchestrator's step ---------------------------------------------------------

    def step(self) -> list[StageOutput]:
        outputs = []
        for replica in self.replicas:
            for out in replica.step():
                orphan = replica.orphans.get(out.request_id) if out.error_kind is ErrorKind.UNAVAILABLE else None
                if orphan is not None and self._rerun(replica, orphan):
                    continue
                outputs.append(out)
        return outputs

    def _rerun(self, dead: Supervisor, request: StageRequest) -> bool:
        serving = self._serving(exclude=dead)
        if not serving:
            return False
        target = self.replicas[self.policy.pick(serving, request)]
        logger.warning("stage %s: re-running request %s on %s after %s died", self.label, request.request_id,
                       target.label, dead.label)
        self.num_reruns += 1
        target.add_request(request)
        return True

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
        return [o for replica in self.replicas for o in replica.wait_objects()]

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()
        if self._on_close is not None:
            self._on_close()


def replicas_of(handle: Supervisor | ReplicaSet) -> list[Supervisor]:
    """A stage handle's copies: a replica set's replicas, or the one supervisor."""
    return handle.replicas if isinstance(handle, ReplicaSet) else [handle]


def count_states(replicas: Sequence[Supervisor]) -> dict[str, int]:
    counts = dict.fromkeys(REPLICA_STATES, 0)
    for replica in replicas:
        counts[replica.state] += 1
    return counts
