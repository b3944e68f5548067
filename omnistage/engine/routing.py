"""Routing policies: which replica of a stage takes a new request (deploy `routing_policy`).

A policy sees the replicas that serve now (their supervisors, in replica order) and the
request, and returns one of them. It keeps no request bookkeeping of its own: how much a
replica holds is read from its supervisor (`Supervisor.held`), the one place that knows.

NOTE on affinity: the key is the request's `session_id` when the caller gave one (a
conversation, a realtime session), else a prefix of its prompt text, so later turns of a
conversation (whose prompt starts with the earlier turns) and prompts sharing a system
prompt land on the replica that holds their prefix cache. The key is mapped by rendezvous
hashing (highest hash of key + replica index wins): when a replica stops serving only its
own keys move, and they come back when it returns.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from typing import Any, Protocol

from omnistage.core.types import StageRequest
from omnistage.runtime.supervisor import Supervisor

AFFINITY_PREFIX_CHARS = 256
"""How much of the prompt text keys affinity when a request names no session."""


class RoutingPolicy(Protocol):
    def pick(self, serving: Sequence[tuple[int, Supervisor]], request: StageRequest) -> int:
        """The index of the replica to take `request` (each replica's own number, kept while it
        lives); `serving` is never empty and holds (index, supervisor) pairs."""


class LeastOutstanding:
    """Least outstanding work: over the requests a replica holds (queued or running), the sum
    of the steps (diffusion) or most tokens (AR) each asks for; one that names neither counts
    as the mean of those that did so far (1 before any). Ties go round in turn, so an idle
    stage still spreads a burst evenly."""

    def __init__(self) -> None:
        self._turn = itertools.count()
        self._num_declared = 0
        self._mean_declared = 1.0

    def pick(self, serving: Sequence[tuple[int, Supervisor]], request: StageRequest) -> int:
        self._learn(declared_work(request))
        start = next(self._turn)
        order = serving[start % len(serving):] + serving[:start % len(serving)]
        return min(order, key=lambda pair: self.outstanding(pair[1]))[0]

    def outstanding(self, replica: Supervisor) -> float:
        return sum(self._work(held.request) for held in replica.held.values())

    def _work(self, request: StageRequest) -> float:
        work = declared_work(request)
        return self._mean_declared if work is None else work

    def _learn(self, work: float | None) -> None:
        if work is not None:
            self._num_declared += 1
            self._mean_declared += (work - self._mean_declared) / self._num_declared


class RoundRobin:
    def __init__(self) -> None:
        self._turn = itertools.count()

    def pick(self, serving: Sequence[tuple[int, Supervisor]], request: StageRequest) -> int:
        return serving[next(self._turn) % len(serving)][0]


class Affinity:
    """Same key, same replica (see the NOTE above)."""

    def pick(self, serving: Sequence[tuple[int, Supervisor]], request: StageRequest) -> int:
        return by_key(serving, affinity_key(request))


POLICIES = {"least_outstanding": LeastOutstanding, "round_robin": RoundRobin, "affinity": Affinity}


def by_key(serving: Sequence[tuple[int, Supervisor]], key: str) -> int:
    """Rendezvous hashing: the serving replica with the highest hash of (its index, key)."""
    return max(serving, key=lambda pair: _digest(f"{pair[0]}:{key}"))[0]


def declared_work(request: StageRequest) -> float | None:
    """The steps (DiffusionParams) or most tokens (SamplingParams) the request asks for, if it says."""
    for name in ("num_inference_steps", "max_tokens"):
        value = getattr(request.params, name, None)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def make_policy(name: str) -> RoutingPolicy:
    if name not in POLICIES:
        raise ValueError(f"routing_policy: {name!r} is not one of {'|'.join(POLICIES)}")
    return POLICIES[name]()


def affinity_key(request: StageRequest) -> str:
    if request.session_id is not None:
        return f"session:{request.session_id}"
    text = prompt_text(request.inputs)
    if text is None:  # nothing to share a cache on: each request is its own key
        return f"request:{request.request_id}"
    return f"prefix:{text[:AFFINITY_PREFIX_CHARS]}"


def prompt_text(inputs: Any) -> str | None:
    """The text a prompt starts with: a string, a {"prompt": ...} dict, chat messages (their
    contents in order), or token ids; None for anything else."""
    if isinstance(inputs, str):
        return inputs
    if isinstance(inputs, dict) and "prompt" in inputs:
        return prompt_text(inputs["prompt"])
    if isinstance(inputs, list | tuple) and inputs:
        if all(isinstance(t, int) for t in inputs[:AFFINITY_PREFIX_CHARS]):
            return ",".join(map(str, inputs[:AFFINITY_PREFIX_CHARS]))
        if all(isinstance(m, dict) for m in inputs):
            return "\n".join(f"{m.get('role')}: {_message_text(m.get('content'))}" for m in inputs)
    return None


def _message_text(content: Any) -> str:
    """A message's text parts (media parts print their object's address, no key to share)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
