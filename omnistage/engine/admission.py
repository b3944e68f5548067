"""Admission by real-time budget: a new audio stream starts only while the pipeline makes audio
fast enough for every stream it has admitted.

A stream needs one second of audio per wall second to stay ahead of its listener. The
orchestrator measures the pipeline's capacity as it runs (`AudioMeter`: audio seconds its
final stages made per wall second, while streams were being made), and admits a new stream
only while none of the admitted ones has fallen behind its listener, none still waits for
its first audio, and each is made at least 1 + `HEADROOM` times faster than real time.
Otherwise the request waits in the orchestrator's queue, in arrival order: its time to first
audio grows, and the server answers 429 once `--max-queued-requests` requests are queued or
running. So an admitted stream does not stall because of a later one.

NOTE: a batch of streams makes more audio per second than one stream (a step costs about
the same for 1 row as for 8), up to where the device saturates, which the meter cannot know
before it gets there. So the measured rate is taken per stream: while the admitted streams
each get their headroom, one more joins; the first newcomer that pushes them under it stops
admission (one newcomer at a time, so the overshoot is one stream, spread over all of them).
Budgeting the measured total for n + 1 streams instead would keep a pipeline whose single
stream is made at 2x real time serving one stream at a time, however well it batches
(benchmarks/RESULTS.md, "TTS under load").

Before the meter has a rate (no busy period has lasted `MIN_SPAN_S` yet: a fast pipeline makes a
whole answer in less), a newcomer starts only while every admitted stream has started and leads
its listener by `LEAD_S` (audio received and not yet played): that lead shows it is made faster
than real time so far, and covers the newcomer's prompt and first chunk. Waiting for a rate there
would serve such a pipeline one stream at a time, each answer ending before a rate is measured.

A stage's deploy field `audio_capacity` fixes the total instead (audio seconds per wall
second at any load): then n + 1 streams with their headroom must fit it. `real_time_admission:
false` admits every request at once.
"""

from __future__ import annotations

from collections import deque

HEADROOM = 0.25
"""Capacity kept spare per admitted stream: a newcomer's prompt and first chunk cost more than its
later audio, and the measured rate moves with the load of the machine."""
WINDOW_S = 2.0
"""The meter's memory: the rate is that of the last WINDOW_S seconds of audio output."""
MIN_SPAN_S = 0.2
"""Shortest span of output the meter trusts for a rate."""
LEAD_S = 0.25
"""Before the meter has a rate, the lead over its listener that every admitted stream needs for a
newcomer to start. It covers the newcomer's prompt and first chunk (0.01-0.03 s alone for the zoo's
tiny speech models, 0.17 s p99 with 32 started at once), and it is more than MIN_SPAN_S, after
which the meter has a rate and that decides. Qwen3's first chunk (0.4 s) gives it alone; CSM's
(0.16 s) needs the next chunk too."""


class AudioMeter:
    """Audio seconds made per wall second while streams are being made.

    Each observation is a piece of audio out at a time. The rate over a busy period is the audio
    after its first piece over the time from that piece to the last one (the first piece was
    made before the span began). An idle gap is not capacity: `idle()` starts a new period,
    and the last rate measured stands until the new period has one of its own."""

    def __init__(self) -> None:
        self._pieces: deque[tuple[float, float]] = deque()  # (time, seconds) of this busy period
        self.rate: float | None = None

    def observe(self, seconds: float, now: float) -> None:
        self._pieces.append((now, seconds))
        while len(self._pieces) > 2 and now - self._pieces[1][0] > WINDOW_S:
            self._pieces.popleft()
        first_time, first_seconds = self._pieces[0]
        span = now - first_time
        if span >= MIN_SPAN_S:
            self.rate = (sum(s for _, s in self._pieces) - first_seconds) / span

    def idle(self) -> None:
        self._pieces.clear()


class RealTimeAdmission:
    def __init__(self, capacity: float | None = None) -> None:
        self.fixed_capacity = capacity
        """Audio seconds per wall second, from the deploy config; None = measured."""
        self.meter = AudioMeter()

    @property
    def capacity(self) -> float | None:
        return self.fixed_capacity if self.fixed_capacity is not None else self.meter.rate

    def admits(self, num_streams: int, num_unstarted: int, num_behind: int, lead: float = 0.0) -> bool:
        """May one more stream start beside `num_streams` admitted ones still being made, of which
        `num_unstarted` have sent no audio yet and `num_behind` have a listener that ran out?
        `lead`: the smallest lead among the started ones (audio received and not yet played, s)."""
        if num_streams == 0:
            return True
        if num_behind:
            return False  # the admitted streams come first
        if self.fixed_capacity is not None:
            return (num_streams + 1) * (1 + HEADROOM) <= self.fixed_capacity
        if num_unstarted:
            return False  # one newcomer at a time
        if self.meter.rate is None:
            return lead >= LEAD_S  # no rate yet: each admitted stream's own lead must cover a newcomer
        return self.meter.rate / num_streams >= 1 + HEADROOM
