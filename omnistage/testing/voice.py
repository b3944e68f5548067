"""A synthetic voice for realtime tests: a vowel-like sound a real VAD takes for speech.

Harmonics of a wavering 120 Hz pitch, shaped by the first three formants of /a/ and
pulsed at 4 syllables a second. silero-vad scores it above 0.8 (a pure tone or noise
scores below 0.1), so server-VAD tests run the real detector without a speech file.
"""

from __future__ import annotations

import numpy as np

_FORMANTS = ((700.0, 130.0), (1220.0, 100.0), (2600.0, 200.0))  # (centre, width) in Hz


def synthetic_speech(seconds: float, rate: int = 24000, pitch: float = 120.0) -> np.ndarray:
    """Mono float32 in [-0.5, 0.5] at `rate`."""
    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * np.cumsum(pitch * (1 + 0.1 * np.sin(2 * np.pi * 3 * t))) / rate
    out = np.zeros_like(t)
    for k in range(1, int(min(4000, rate / 2) // pitch)):
        gain = sum(np.exp(-((k * pitch - centre) / width) ** 2) for centre, width in _FORMANTS)
        out += gain / np.sqrt(k) * np.sin(k * phase)
    out *= 0.5 * (1 - np.cos(2 * np.pi * 4 * t))  # syllables
    return (0.5 * out / np.abs(out).max()).astype(np.float32)
