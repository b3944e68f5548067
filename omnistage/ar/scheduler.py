"""Continuous-batching scheduler: which sequences run in the next forward.

Plain Python over `Sequence` objects, no torch: tests drive it with hand-built token
ids in place of a model (see tests/ar/test_scheduler.py).

The KV cache is a slot cache: each running sequence owns one row (slot) big enough for
`max_model_len` tokens, so a sequence admitted once never needs preemption.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from omnistage.ar.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    """One forward's worth of work.

    A prefill batch holds newly admitted sequences in slots `first_slot..first_slot+n-1`;
    a decode batch holds every running sequence, in slots `0..n-1` (so row i = slot i).
    `slot_moves` are KV rows to copy (src, dst) before the forward: the scheduler keeps
    running sequences packed into the lowest slots so a decode batch is a plain slice.
    """
    seqs: list[Sequence]
    is_prefill: bool
    first_slot: int = 0
    slot_moves: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_seqs(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(self, max_num_seqs: int, max_model_len: int, max_num_batched_tokens: int | None = None) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max(max_num_batched_tokens or 0, max_model_len)
        """Prefill budget in padded tokens (rows x longest prompt); never below max_model_len so any prompt fits."""
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # running[i].slot == i
        self._pending_moves: list[tuple[int, int]] = []

    # --- requests in and out ---------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        if seq.num_prompt_tokens > self.max_model_len:
            raise ValueError(f"request {seq.request_id!r}: prompt has {seq.num_prompt_tokens} tokens, "
                             f"more than max_model_len={self.max_model_len}")
        self.waiting.append(seq)

    def abort(self, request_id: str) -> Sequence | None:
        """Remove the request wherever it is; returns it (finished with "abort") or None if unknown."""
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                seq.finish("abort")
                return seq
        for seq in self.running:
            if seq.request_id == request_id:
                seq.finish("abort")
                self.free_finished()
                return seq
        return None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_free_slots(self) -> int:
        return self.max_num_seqs - len(self.running)

    # --- the step ----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput | None:
        """The next batch, or None when there is nothing to run.

        NOTE: prefill first, as in nano-vllm. Waiting sequences are admitted in arrival
        order while a slot is free and the padded prefill (rows x longest prompt) fits the
        token budget; if any were admitted this step is their prefill, otherwise it is one
        decode step for every running sequence. Running sequences wait one step while
        newcomers prefill, which is what lets requests join at every decode step.
        """
        moves, self._pending_moves = self._pending_moves, []
        admitted: list[Sequence] = []
        longest = 0
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            seq = self.waiting[0]
            new_longest = max(longest, seq.num_prompt_tokens)
            if admitted and new_longest * (len(admitted) + 1) > self.max_num_batched_tokens:
                break
            self.waiting.popleft()
            longest = new_longest
            admitted.append(seq)
        if admitted:
            first = len(self.running)
            for i, seq in enumerate(admitted):
                seq.slot = first + i
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
            return SchedulerOutput(admitted, is_prefill=True, first_slot=first, slot_moves=moves)
        if self.running:
            return SchedulerOutput(list(self.running), is_prefill=False, slot_moves=moves)
        return None  # idle (pending moves, if any, belonged to sequences that have since finished)

    def update(self, batch: SchedulerOutput, token_ids: list[int]) -> list[Sequence]:
        """Append one sampled token per sequence of `batch`; free and return the ones that finished.

        Sequences aborted while their forward ran are skipped.
        """
        now_finished = []
        for seq, token_id in zip(batch.seqs, token_ids):
            if seq.is_finished:
                continue
            seq.append_token(token_id)
            if seq.is_finished:
                now_finished.append(seq)
        if now_finished:
            self.free_finished()
        return now_finished

    def free_finished(self) -> None:
        """Drop finished sequences from `running` and repack the survivors into slots 0..n-1.

        Survivors already below the new count keep their slot; those above it move into
        the holes. Sources are all >= n and destinations < n, so the copies never overlap.
        """
        alive = [s for s in self.running if not s.is_finished]
        n = len(alive)
        holes = iter(sorted(set(range(n)) - {s.slot for s in alive}))
        for seq in alive:
            if seq.slot >= n:
                dst = next(holes)
                self._pending_moves.append((seq.slot, dst))
                seq.slot = dst
        for seq in self.running:
            if seq.is_finished:
                seq.slot = -1
        alive.sort(key=lambda s: s.slot)
        self.running = alive
