"""Waiting queues in arrival order, for the engines' schedulers (diffusion and AR).

Work normally arrives in order, so a new request joins the end of the queue. A request that
its replica's death sent to another copy (`ReplicaSet` re-runs it there) arrives late but old:
it has waited since the orchestrator made it (`StageRequest.arrival_time`, kept by the
re-run), so it goes ahead of the work queued here after it was made, as the oldest request,
instead of waiting behind all of it a second time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def insert_by_arrival(queue: deque[T], item: T, arrival: Callable[[T], float | None]) -> None:
    """Put `item` behind the last queued item that arrived no later than it (the end, for work
    arriving in order; equal times keep their order). An arrival of None counts as now: the end."""
    when = arrival(item)
    index = len(queue)
    if when is not None:
        while index > 0 and _later(arrival(queue[index - 1]), when):
            index -= 1
    queue.insert(index, item)


def _later(queued: float | None, when: float) -> bool:
    return queued is not None and queued > when
