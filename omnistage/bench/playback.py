"""A listener's player on the client side: it starts playing a streamed answer when the first
audio arrives and plays it in real time; whenever the next audio arrives after what it had ran
out, it stalls (an underrun) until that audio is there."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Playback:
    bytes_per_second: float
    underruns: list[float] = field(default_factory=list)
    """Each stall, in seconds."""
    _runs_out_at: float | None = None  # the wall time at which the audio received so far has played

    def receive(self, num_bytes: int, now: float) -> None:
        """`num_bytes` of audio arrived at wall time `now` (seconds, any monotonic clock)."""
        if self._runs_out_at is None:
            self._runs_out_at = now
        elif now > self._runs_out_at:
            self.underruns.append(now - self._runs_out_at)
            self._runs_out_at = now
        self._runs_out_at += num_bytes / self.bytes_per_second
