"""Autoscaling: how many copies a replicated stage should run for the work it holds now.

A stage with `max_replicas` set scales between `min_replicas` and `max_replicas` copies.
Its `ReplicaSet` asks the `Autoscaler` once per orchestrator step, with the requests held
by its copies (queued or running, the draining ones' too) and the number of copies that
take requests (serving, starting or restarting; not draining), and does what it answers:
starts copies, or drains one (no new requests, finishes its own, then stops).

NOTE on the algorithm: the copies wanted are ceil(outstanding / target), clamped to
[min, max]. More than the current count scales up at once (a burst should not wait);
fewer must hold for `scale_down_delay_s` without a break before one copy drains, and the
next one waits as long again, so a dip between bursts costs no cold start and a burst's
tail does not drop the stage to `min_replicas` in one step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class AutoscalePolicy:
    min_replicas: int
    max_replicas: int
    target_outstanding_per_replica: float
    scale_down_delay_s: float


class Autoscaler:
    def __init__(self, policy: AutoscalePolicy, clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self._clock = clock
        self._low_since: float | None = None  # since when the work has wanted fewer copies

    def wanted(self, num_outstanding: int) -> int:
        p = self.policy
        wanted = math.ceil(num_outstanding / p.target_outstanding_per_replica)
        return min(max(wanted, p.min_replicas), p.max_replicas)

    def decide(self, num_outstanding: int, num_replicas: int) -> int:
        """The copies to run from now: more than `num_replicas` to scale up, one fewer to drain one."""
        wanted = self.wanted(num_outstanding)
        if wanted >= num_replicas:
            self._low_since = None
            return wanted
        now = self._clock()
        if self._low_since is None:
            self._low_since = now
        if now - self._low_since < self.policy.scale_down_delay_s:
            return num_replicas
        self._low_since = now  # the next copy waits out a cool-down of its own
        return num_replicas - 1
