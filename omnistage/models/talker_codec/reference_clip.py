"""The voice-cloning fields of a speech request (`ref_audio`, `ref_sample_rate`, `ref_text`),
checked in one place for every family that clones a voice from a clip (CSM, Qwen3-TTS Base,
Higgs-Audio v2). Each problem is a RequestError naming its field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnistage.core.errors import RequestError

MAX_REF_SECONDS = 60.0
"""Longest reference clip: its codes share the talker's context with the text and the reply."""


@dataclass(frozen=True)
class ReferenceClip:
    audio: np.ndarray
    """float32 mono samples at `sample_rate`."""
    sample_rate: int
    text: str
    """What the clip says ("" when not given)."""


def reference_clip(inputs: Mapping[str, Any], max_seconds: float = MAX_REF_SECONDS) -> ReferenceClip | None:
    """The request's clip, checked; None when it has none (then `ref_sample_rate` or `ref_text`
    alone is refused)."""
    audio = inputs.get("ref_audio")
    if audio is None:
        for key in ("ref_sample_rate", "ref_text"):
            if inputs.get(key) not in (None, ""):
                raise RequestError(key, f"{key}: goes with ref_audio")
        return None
    audio = np.asarray(audio)
    if audio.ndim != 1 or audio.size == 0 or not np.issubdtype(audio.dtype, np.floating):
        raise RequestError("ref_audio", f"ref_audio: expected a non-empty 1-D float array (mono), got {audio.dtype} "
                           f"with shape {list(audio.shape)}")
    if not np.isfinite(audio).all():
        raise RequestError("ref_audio", "ref_audio: contains NaN or infinite samples")
    rate = inputs.get("ref_sample_rate")
    if not isinstance(rate, int) or isinstance(rate, bool) or rate < 1000:
        raise RequestError("ref_sample_rate", f"ref_sample_rate: the reference clip's sample rate (Hz, >= 1000) is "
                           f"required, got {rate!r}")
    if audio.size / rate > max_seconds:
        raise RequestError("ref_audio", f"ref_audio: {audio.size / rate:.1f} s is longer than {max_seconds:.0f} s")
    text = inputs.get("ref_text") or ""
    if not isinstance(text, str):
        raise RequestError("ref_text", f"ref_text: expected a string, got {type(text).__name__}")
    return ReferenceClip(audio.astype(np.float32), rate, text)
