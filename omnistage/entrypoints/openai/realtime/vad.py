"""Server VAD: where the user's speech starts and stops in the audio they stream.

Two parts, so the turn logic can be tested with any detector:

- `SpeechDetector`: speech probability of one fixed window of 16 kHz audio, with state
  carried from window to window. `SileroDetector` runs silero-vad's JIT model (weights
  inside the `silero-vad` wheel, so it runs offline).
- `TurnDetector`: OpenAI's `server_vad` over those probabilities: speech starts at the
  first window at or above `threshold` and stops after `silence_duration_ms` below it;
  the start is reported `prefix_padding_ms` early so the turn keeps its first syllable.

NOTE on the hysteresis: a window only counts as silence below `threshold - 0.15` (what
silero's own VADIterator does); one threshold for both made a word's quiet middle end
the turn.
"""

from __future__ import annotations

import importlib.util
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

VAD_RATE = 16000


class SpeechDetector(Protocol):
    window: int
    """Samples (at 16 kHz) per `probability` call."""

    def probability(self, window: np.ndarray) -> float: ...

    def reset(self) -> None: ...


class SileroDetector:
    """silero-vad v5+ on 512-sample windows (32 ms), one model state per session."""

    window = 512
    _weights: bytes | None = None  # read once per process; each session loads its own module

    def __init__(self) -> None:
        import torch

        if SileroDetector._weights is None:
            SileroDetector._weights = _silero_jit_path().read_bytes()
        self._torch = torch
        with warnings.catch_warnings():  # torch 2.13 deprecates jit.load; silero ships no other torch format
            warnings.simplefilter("ignore", DeprecationWarning)
            self.model = torch.jit.load(io.BytesIO(SileroDetector._weights), map_location="cpu").eval()

    def probability(self, window: np.ndarray) -> float:
        with self._torch.inference_mode():
            return float(self.model(self._torch.from_numpy(np.ascontiguousarray(window, np.float32)), VAD_RATE))

    def reset(self) -> None:
        self.model.reset_states()


def _silero_jit_path() -> Path:
    # The file is found without importing `silero_vad`: its package import sets
    # torch.set_num_threads(1) for the whole server process.
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("server VAD needs the silero-vad package (pip install silero-vad)")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "silero_vad.jit"


@dataclass
class VADEvent:
    kind: str
    """"started" or "stopped"."""
    ms: int
    """Audio time since the session's first appended sample: speech start (less the
    prefix padding) or speech end."""


class TurnDetector:
    def __init__(self, detector: SpeechDetector, threshold: float = 0.5, prefix_padding_ms: int = 300,
                 silence_duration_ms: int = 500) -> None:
        self.detector = detector
        self.threshold = threshold
        self.prefix_padding_ms = prefix_padding_ms
        self.silence_duration_ms = silence_duration_ms
        self.is_speaking = False
        self._pending = np.zeros(0, dtype=np.float32)
        self._num_samples = 0  # 16 kHz samples run through the detector
        self._last_speech_ms = 0

    def feed(self, audio: np.ndarray) -> list[VADEvent]:
        """Events found in `audio` (16 kHz float32, following what was fed before)."""
        self._pending = np.concatenate([self._pending, np.asarray(audio, dtype=np.float32)])
        events = []
        n = self.detector.window
        while self._pending.size >= n:
            window, self._pending = self._pending[:n], self._pending[n:]
            prob = self.detector.probability(window)
            start_ms = self._num_samples * 1000 // VAD_RATE
            self._num_samples += n
            end_ms = self._num_samples * 1000 // VAD_RATE
            if prob >= self.threshold:
                self._last_speech_ms = end_ms
                if not self.is_speaking:
                    self.is_speaking = True
                    events.append(VADEvent("started", max(0, start_ms - self.prefix_padding_ms)))
            elif (self.is_speaking and prob < max(self.threshold - 0.15, 0.01)
                  and end_ms - self._last_speech_ms >= self.silence_duration_ms):
                self.is_speaking = False
                events.append(VADEvent("stopped", self._last_speech_ms))
        return events
