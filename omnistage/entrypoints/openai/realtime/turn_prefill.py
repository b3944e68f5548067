"""Incremental prefill of a realtime turn: while the user speaks, their audio is cut into clips
as it arrives, and the conversation so far plus the clips cut so far are prefilled into the
thinker's prefix cache (../prefix_warmer.py). At the commit the user's item holds the same clips
plus the rest of the turn, so its prompt starts with what was prefilled: the answer computes
only the rest (the last clip and the turn's end).

NOTE on the clips: an audio encoder's features of a growing clip are not a prefix of each other
(Whisper's log-mel is scaled by the clip's loudest frame, and the encoder attends across the
clip), so a turn prefilled as it grows is heard as several clips, each encoded alone: a clip once
cut never changes, so its tokens and their keys stay a prefix of the final prompt. The answer is
what the model says to that chunked prompt, with or without the cache; with the prefill off
(`--no-realtime-prefill`) a turn is one clip, as before.
"""

from __future__ import annotations

import numpy as np

CLIP_MS = 500
"""A cut every half second of turn: short enough that a short answer ("yes, please", a turn of under a
second as server VAD cuts it) has a clip prefilled before it ends, long enough that a clip carries a
word or two for the encoder against its two marker tokens of overhead."""
MIN_CLIP_MS = 100
"""No clip shorter than this (the commit's own minimum): a shorter rest is padded with silence to it."""


class TurnCuts:
    """Where one turn's audio is cut, as it grows (offsets in samples from the turn's start)."""

    def __init__(self) -> None:
        self.cuts: list[int] = []

    def grow(self, num_samples: int, rate: int) -> bool:
        """The turn now holds `num_samples`: cut every whole clip that is there; True if any was cut."""
        clip = CLIP_MS * rate // 1000
        num_cuts = len(self.cuts)
        while num_samples >= (self.cuts[-1] if self.cuts else 0) + clip:
            self.cuts.append((self.cuts[-1] if self.cuts else 0) + clip)
        return len(self.cuts) > num_cuts

    def final(self, audio: np.ndarray, rate: int) -> tuple[np.ndarray, tuple[int, ...]]:
        """The committed turn's audio and cuts. No clip is longer than the cut ones: some families
        (Qwen3-Omni) pad a request's clips to its longest before their features, so a longer last
        clip would change the features of those already prefilled. A rest shorter than a clip may be
        is padded with silence instead of joining the clip before."""
        cuts = tuple(c for c in self.cuts if c < len(audio))
        rest, min_clip = len(audio) - (cuts[-1] if cuts else 0), MIN_CLIP_MS * rate // 1000
        if cuts and rest < min_clip:
            audio = np.concatenate([audio, np.zeros(min_clip - rest, audio.dtype)])
        return audio, cuts

    def reset(self) -> None:
        self.cuts = []
