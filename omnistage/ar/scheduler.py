"""Continuous-batching scheduler: which sequences run in the next forward, and how many tokens each.

Plain Python over `Sequence` objects, no torch: tests drive it with hand-built token
ids in place of a model (see tests/ar/test_ar_scheduler.py). KV-cache blocks come from
the `BlockManager`, which it calls before every step.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from omnistage.ar.block_manager import BlockManager
from omnistage.ar.sequence import Sequence, SequenceStatus
from omnistage.core.queueing import insert_by_arrival

DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


@dataclass
class ScheduledSeq:
    seq: Sequence
    start: int
    """Tokens already in the cache: this step feeds tokens [start, start + num_new)."""
    num_new: int
    samples: bool
    """The step catches the sequence up, so its last position's logits give a new token."""


@dataclass
class ARSchedulerOutput:
    """One step's work: prompt chunks (prefills) and one-token decodes, run as two groups.

    `preempted` were pushed back to the waiting queue by this step (their blocks freed;
    they are recomputed when readmitted).
    """
    prefills: list[ScheduledSeq] = field(default_factory=list)
    decodes: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def items(self) -> list[ScheduledSeq]:
        return self.decodes + self.prefills

    @property
    def seqs(self) -> list[Sequence]:
        return [item.seq for item in self.items]

    @property
    def num_seqs(self) -> int:
        return len(self.prefills) + len(self.decodes)

    @property
    def num_tokens(self) -> int:
        return sum(item.num_new for item in self.items)


class Scheduler:
    def __init__(self, max_num_seqs: int, max_model_len: int, block_manager: BlockManager, *,
                 max_num_batched_tokens: int | None = None, enable_chunked_prefill: bool = True,
                 packed: bool = False, deadline_order: bool = False) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.blocks = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
        """Tokens one step feeds (decodes + prompt chunks). Without chunking a prompt longer than
        this still runs, alone, as one prefill."""
        self.enable_chunked_prefill = enable_chunked_prefill
        self.packed = packed
        """The model runs decodes and prompt chunks in one packed forward: the budget counts real
        tokens, and any prompt that does not fit what is left is chunked (as vLLM v1)."""
        self.deadline_order = deadline_order
        """Audio streams (sequences with `frame_seconds`): more may be resident than a step runs
        (as the KV blocks allow), and each step runs the `max_num_seqs` nearest an underrun."""
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last is preempted first
        self.num_preemptions = 0

    # --- requests in and out ---------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        if seq.num_prompt_tokens > self.max_model_len:
            raise ValueError(f"request {seq.request_id!r}: prompt has {seq.num_prompt_tokens} tokens, "
                             f"more than max_model_len={self.max_model_len}")
        insert_by_arrival(self.waiting, seq, lambda s: s.arrival_time)

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

    def has_runnable(self) -> bool:
        """Anything a step could run now (not only sequences waiting for streamed input)?"""
        return any(not s.awaiting_input for s in self.waiting) or any(not s.awaiting_input for s in self.running)

    # --- the step ----------------------------------------------------------------------------

    def schedule(self) -> ARSchedulerOutput | None:
        """The next step, or None when there is nothing to run.

        NOTE: running sequences first, as vLLM v1: every decoding one gets its one token,
        then those mid-prompt get their next chunk, oldest first, and blocks for them.
        When blocks run out, the newest running sequence is preempted (its blocks freed,
        recomputed later from its tokens) until the older one fits. Then waiting
        sequences are admitted in arrival order while a seat, the budget and blocks
        allow, each starting after the longest cached prefix of its tokens; the first
        that does not fit stops admission (no overtaking). So a newcomer's prefill shares
        the step with the running decodes, in chunks of what the budget leaves.

        The budget counts what the forwards compute: one token per decode, and the prefill
        group padded to its longest row (rows x longest chunk), so ragged prompts do not
        pay for padding beyond it; with a packed forward, each row's real tokens.

        With `deadline_order` (audio streams), waiting sequences are admitted first, while
        KV blocks allow (a seat is no longer the limit), and the step then takes up to
        `max_num_seqs` resident sequences, decodes and prompts alike, earliest deadline first
        (`Playback.deadline`, which also bounds how long late streams delay a newcomer): a
        newcomer's first frames before a stream that is seconds ahead of its listener. When
        all fit, the order changes nothing.
        """
        out = ARSchedulerOutput()
        if self.deadline_order:
            self._admit_resident()
            groups = [sorted(self.running, key=lambda s: s.playback.deadline(s.arrival_time))]
        else:
            groups = [[s for s in self.running if not s.is_prefilling], [s for s in self.running if s.is_prefilling]]
        scheduled: set[int] = set()
        for group in groups:
            for seq in group:
                if out.num_seqs >= self.max_num_seqs:
                    break
                if seq.status is not SequenceStatus.RUNNING or id(seq) in scheduled or seq.awaiting_input:
                    continue  # preempted by an earlier one in this step, or waiting for streamed input
                num_new = self._num_new(seq, out)
                if num_new == 0:
                    break
                end = seq.num_computed_tokens + num_new
                while not self.blocks.can_append(seq, end):
                    victim = self._victim(scheduled)
                    self._preempt(victim, out)
                    if victim is seq:
                        break
                if seq.status is not SequenceStatus.RUNNING:
                    continue  # preempted itself
                self.blocks.append(seq, end)
                self._add(out, seq, num_new)
                scheduled.add(id(seq))
        if not self.deadline_order:
            self._admit_and_schedule(out)
        return out if out.items else None

    def _admit_and_schedule(self, out: ARSchedulerOutput) -> None:
        """Admit waiting sequences in arrival order into this step while a seat, the budget and
        blocks allow; the first that does not fit stops admission."""
        for seq in list(self.waiting):
            if len(self.running) >= self.max_num_seqs or out.preempted:
                break
            if seq.awaiting_input:
                continue  # its prompt is not all there yet: the ones behind it may go first
            hits = self.blocks.match_prefix(seq)
            seq.num_computed_tokens = len(hits) * self.blocks.block_size
            num_new = self._num_new(seq, out)
            end = seq.num_computed_tokens + num_new
            reserve = self._reserve(seq, end)
            if num_new == 0 or not self.blocks.can_allocate(seq, hits, max(end, reserve)):
                seq.num_computed_tokens = 0
                break
            self._admit(seq, hits, max(end, reserve))
            self._add(out, seq, num_new)

    def _admit_resident(self) -> None:
        """Deadline order: admit waiting sequences in arrival order while blocks allow (whole
        reservations, or the cached prefix of a recomputable one); the step picks from them all."""
        for seq in list(self.waiting):
            if seq.awaiting_input:
                continue
            hits = self.blocks.match_prefix(seq)
            seq.num_computed_tokens = len(hits) * self.blocks.block_size
            reserve = self._reserve(seq, seq.num_computed_tokens)
            if not self.blocks.can_allocate(seq, hits, reserve):
                seq.num_computed_tokens = 0
                break
            self._admit(seq, hits, reserve)

    def _reserve(self, seq: Sequence, end: int) -> int:
        """Tokens of blocks to hold at admission: a sequence that cannot be preempted holds its whole length."""
        return end if seq.recomputable else min(self.max_model_len, seq.num_prompt_tokens + seq.max_tokens)

    def _admit(self, seq: Sequence, hits: list[int], num_tokens: int) -> None:
        self.waiting.remove(seq)
        self.blocks.allocate(seq, hits, num_tokens)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def _num_new(self, seq: Sequence, out: ARSchedulerOutput) -> int:
        """Tokens `seq` feeds this step: all it lacks, or a chunk of it; 0 if it must wait."""
        if self.packed:
            room = self.max_num_batched_tokens - out.num_tokens
            need = seq.num_uncomputed_tokens if seq.is_prefilling else 1
            if need <= room:
                return need
            if self.enable_chunked_prefill and seq.recomputable and seq.is_prefilling:
                return max(room, 0)
            return 0 if out.items else need
        rows = len(out.prefills)
        width = max((item.num_new for item in out.prefills), default=0)
        room = self.max_num_batched_tokens - len(out.decodes) - rows * width
        if not seq.is_prefilling:
            return 1 if room >= 1 else 0
        room += rows * width  # the prefill group's share, re-padded with this row in it
        need = seq.num_uncomputed_tokens
        if (rows + 1) * max(need, width) <= room:
            return need
        # NOTE: only a prompt longer than any step could take is chunked; a shorter one waits
        # for a step it fits whole, since a chunk's short tail would be padded to its
        # neighbours' length in the next step. Only models taking a prompt in pieces chunk.
        if self.enable_chunked_prefill and seq.recomputable and need > self.max_num_batched_tokens - len(out.decodes):
            chunk = room // (rows + 1)
            return chunk if chunk >= max(width, 1) else 0
        return 0 if out.items else need  # whole prompts only: alone, past the budget if need be

    def _victim(self, scheduled: set[int]) -> Sequence:
        """The newest running sequence that can be recomputed (itself, last of all)."""
        for seq in reversed(self.running):
            if seq.recomputable and id(seq) not in scheduled:
                return seq
        raise RuntimeError("the KV cache cannot hold the running sequences and none can be preempted")

    def _preempt(self, seq: Sequence, out: ARSchedulerOutput) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    @staticmethod
    def _add(out: ARSchedulerOutput, seq: Sequence, num_new: int) -> None:
        start = seq.num_computed_tokens
        item = ScheduledSeq(seq, start, num_new, start + num_new == seq.num_tokens)
        (out.prefills if seq.is_prefilling else out.decodes).append(item)

    def update(self, batch: ARSchedulerOutput, token_ids: dict[str, int], now: float | None = None) -> list[Sequence]:
        """After the forward: count the fed tokens as computed, publish full blocks to the prefix
        cache, append the sampled token of every sequence that caught up (`token_ids` by request
        id); free and return the ones that finished. Sequences aborted meanwhile are skipped."""
        now_finished = []
        now = time.monotonic() if now is None else now
        for item in batch.items:
            seq = item.seq
            if seq.is_finished:
                continue
            seq.num_computed_tokens = item.start + item.num_new
            self.blocks.cache_full_blocks(seq)
            if seq.request_id in token_ids:
                seq.append_token(token_ids[seq.request_id], now)
                if seq.is_finished:
                    now_finished.append(seq)
        if now_finished:
            self.free_finished()
        return now_finished

    def free_finished(self) -> None:
        """Drop finished sequences from `running` and give their blocks back."""
        alive = []
        for seq in self.running:
            if seq.is_finished:
                self.blocks.free(seq)
            else:
                alive.append(seq)
        self.running = alive
