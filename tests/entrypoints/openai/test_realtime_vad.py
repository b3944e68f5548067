"""Server VAD: `TurnDetector` honours threshold, prefix_padding_ms and silence_duration_ms
(driven by scripted probabilities), and the real silero model tells the synthetic voice
from a tone and from noise (so the session tests' VAD is the real detector at work)."""

from __future__ import annotations

import numpy as np

from omnistage.entrypoints.openai.realtime.vad import SileroDetector, TurnDetector
from omnistage.testing.voice import synthetic_speech


class Scripted:
    """Probabilities in order, one per 512-sample window (32 ms)."""

    window = 512

    def __init__(self, probs: list[float]):
        self.probs = list(probs)

    def probability(self, window: np.ndarray) -> float:
        return self.probs.pop(0)

    def reset(self) -> None:
        pass


def events(probs: list[float], **kwargs) -> list[tuple[str, int]]:
    turns = TurnDetector(Scripted(probs), **kwargs)
    return [(e.kind, e.ms) for e in turns.feed(np.zeros(512 * len(probs), np.float32))]


def test_threshold_padding_and_silence_duration():
    speech = [0.0] * 10 + [0.9] * 10 + [0.0] * 20  # speech from window 10 (320 ms) to 20 (640 ms)
    assert events(speech, threshold=0.5, prefix_padding_ms=100, silence_duration_ms=300) == [
        ("started", 220), ("stopped", 640)]
    assert events(speech, threshold=0.95, prefix_padding_ms=100, silence_duration_ms=300) == []  # never loud enough
    assert events(speech, threshold=0.5, prefix_padding_ms=0, silence_duration_ms=1000) == [("started", 320)]
    # a pause shorter than silence_duration_ms is one turn; a longer one is two
    gap = [0.9] * 5 + [0.0] * 5 + [0.9] * 5 + [0.0] * 20
    assert events(gap, threshold=0.5, prefix_padding_ms=0, silence_duration_ms=200) == [
        ("started", 0), ("stopped", 480)]
    assert events(gap, threshold=0.5, prefix_padding_ms=0, silence_duration_ms=100) == [
        ("started", 0), ("stopped", 160), ("started", 320), ("stopped", 480)]


def test_a_score_between_the_thresholds_does_not_end_the_turn():
    wavering = [0.9] * 5 + [0.4] * 20 + [0.0] * 10  # 0.4: under 0.5, above 0.5 - 0.15
    assert events(wavering, threshold=0.5, prefix_padding_ms=0, silence_duration_ms=100) == [
        ("started", 0), ("stopped", 160)]  # ends at the first window under 0.35; the speech ended at 160 ms
    assert len(events([0.9] * 5 + [0.4] * 20, threshold=0.5, prefix_padding_ms=0, silence_duration_ms=100)) == 1


def test_silero_hears_the_synthetic_voice_and_not_a_tone_or_noise():
    detector = SileroDetector()
    t = np.arange(16000) / 16000

    def peak(audio: np.ndarray) -> float:
        detector.reset()
        return max(detector.probability(audio[i:i + 512]) for i in range(0, len(audio) - 511, 512))

    assert peak(synthetic_speech(1.0, rate=16000)) > 0.8
    assert peak((0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)) < 0.3
    assert peak(np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32)) < 0.3
