"""A listener's player: it starts playing a streamed answer when the first audio arrives and plays
it in real time; whenever the next audio arrives after what it had ran out, it stalls (an
underrun) until that audio is there. The server keeps one per streamed request (its audio
metrics) and `omnistage bench serve` one per stream on the client side."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Playback:
    underruns: list[float] = field(default_factory=list)
    """Each stall, in seconds."""
    runs_out_at: float | None = None
    """The wall time at which the audio received so far has played (None before any audio)."""

    def receive(self, seconds: float, now: float) -> float:
        """`seconds` of audio arrived at wall time `now` (any monotonic clock); returns the stall it
        ended (0.0 when the player still had audio)."""
        stall = 0.0
        if self.runs_out_at is None:
            self.runs_out_at = now
        elif now > self.runs_out_at:
            stall = now - self.runs_out_at
            self.underruns.append(stall)
            self.runs_out_at = now
        self.runs_out_at += seconds
        return stall

    def ahead(self, now: float) -> bool:
        """Whether the player still has audio to play at `now`."""
        return self.runs_out_at is not None and self.runs_out_at > now


STARVATION_BOUND_S = 0.5
"""Deadline order (the AR scheduler, the generation engine): the longest a stream's lateness keeps
a newcomer from its first chunk."""


def deadline_key(playback: Playback, start: float, now: float, starvation_bound_s: float = STARVATION_BOUND_S) -> float:
    """Earliest-deadline-first key of a stream whose output `playback` plays: the wall time its
    listener runs out of audio, or `start` (when it arrived) before it has any, since its first
    chunk is what it waits for. Lateness beyond `starvation_bound_s` buys no more priority, so a
    stream far behind cannot keep a new one from its first chunk for longer than the bound: once
    a newcomer has waited that long its key is the smallest. Sort ascending; ties keep order."""
    deadline = start if playback.runs_out_at is None else playback.runs_out_at
    return max(deadline, now - starvation_bound_s)
