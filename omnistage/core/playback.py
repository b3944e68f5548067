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

    def deadline(self, start: float) -> float:
        """When the listener needs the next audio: the time the audio so far runs out, or `start`
        (the stream's arrival) before it has any, its first chunk being what it waits for. The
        streams nearest an underrun are the ones with the earliest deadline (EDF).

        NOTE: the bound against starvation comes from the player itself. A late stream's player
        stalls and restarts at its next audio, so its deadline is never earlier than the time
        that audio came; a newcomer's stays its arrival. So once each late stream ahead of it
        has had one turn, a newcomer's first chunk goes first, however late they are."""
        return start if self.runs_out_at is None else self.runs_out_at

    def lead(self, now: float) -> float:
        """Seconds of audio received and not yet played at `now` (0.0 before any audio, or when the
        player has run out)."""
        return 0.0 if self.runs_out_at is None else max(0.0, self.runs_out_at - now)

    def ahead(self, now: float) -> bool:
        """Whether the player still has audio to play at `now`."""
        return self.runs_out_at is not None and self.runs_out_at > now

