"""What a CSM request says: the text, whose voice speaks it, and an optional reference clip.

CSM conditions on a speaker id written into the prompt (`[0]Hello.`) and, for voice
cloning, on a context turn before it: the reference clip's transcript and its audio
codes, spoken by the same speaker. So:

- a built-in voice is a named speaker id (`BUILTIN_VOICES`);
- a cloned voice is a reference clip (`ref_audio`, any sample rate, mono float) with its
  transcript (`ref_text`, may be empty), prepended as a context turn.

Prompts are a str (the text, default voice) or a dict with the keys in `PROMPT_KEYS`.
Every problem raises ValueError naming the key, so the server answers 400.
Torch-free: the server and the family registration import it.
"""

from __future__ import annotations

from omnistage.core.errors import RequestError
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# OpenAI's voice names, so that OpenAI clients work unchanged; each is one CSM speaker id.
BUILTIN_VOICES: dict[str, int] = {"alloy": 0, "echo": 1, "fable": 2, "onyx": 3, "nova": 4, "shimmer": 5}
DEFAULT_VOICE = "alloy"
PROMPT_KEYS = ("prompt", "voice", "ref_audio", "ref_sample_rate", "ref_text")
MAX_REF_SECONDS = 60.0
"""Longest reference clip: its codes share the backbone's context with the text and the reply."""


@dataclass
class CsmPrompt:
    text: str
    speaker: int
    ref_audio: np.ndarray | None = None
    """float32 mono reference clip at `ref_sample_rate`, or None (no cloning)."""
    ref_sample_rate: int | None = None
    ref_text: str = ""


def parse_prompt(inputs: Any) -> CsmPrompt:
    """A user prompt (str, or dict with `PROMPT_KEYS`) -> `CsmPrompt`; ValueError names the bad key."""
    if isinstance(inputs, str):
        inputs = {"prompt": inputs}
    if not isinstance(inputs, Mapping):
        raise RequestError("prompt", f"prompt: CSM takes a str or a dict with keys {list(PROMPT_KEYS)}, "
                         f"got {type(inputs).__name__}")
    if "instructions" in inputs:
        raise RequestError("instructions", "instructions: CSM does not follow instructions; choose a voice, or clone one")
    unknown = sorted(set(inputs) - set(PROMPT_KEYS))
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown CSM prompt key; expected {list(PROMPT_KEYS)}")
    text = inputs.get("prompt")
    if not isinstance(text, str) or not text.strip():
        raise RequestError("prompt", "prompt: the text to speak must be a non-empty string")
    voice = inputs.get("voice")
    voice = DEFAULT_VOICE if voice is None else voice
    if voice not in BUILTIN_VOICES:
        raise RequestError("voice", f"voice: unknown voice {voice!r}; built-in voices: {', '.join(BUILTIN_VOICES)}")
    prompt = CsmPrompt(text=text, speaker=BUILTIN_VOICES[voice])
    ref = inputs.get("ref_audio")
    if ref is None:
        for key in ("ref_sample_rate", "ref_text"):
            if inputs.get(key) is not None:
                raise ValueError(f"{key}: given without ref_audio")
        return prompt
    audio = np.asarray(ref)
    if audio.ndim != 1 or audio.size == 0 or not np.issubdtype(audio.dtype, np.floating):
        raise RequestError("ref_audio", f"ref_audio: expected a non-empty 1-D float array (mono), got {audio.dtype} "
                         f"with shape {list(audio.shape)}")
    if not np.isfinite(audio).all():
        raise RequestError("ref_audio", "ref_audio: contains NaN or infinite samples")
    rate = inputs.get("ref_sample_rate")
    if not isinstance(rate, int) or isinstance(rate, bool) or rate < 1000:
        raise RequestError("ref_sample_rate", f"ref_sample_rate: the reference clip's sample rate (Hz, >= 1000) is required, got {rate!r}")
    if audio.size / rate > MAX_REF_SECONDS:
        raise RequestError("ref_audio", f"ref_audio: {audio.size / rate:.1f} s is longer than {MAX_REF_SECONDS:.0f} s")
    ref_text = inputs.get("ref_text") or ""
    if not isinstance(ref_text, str):
        raise RequestError("ref_text", f"ref_text: expected a string, got {type(ref_text).__name__}")
    prompt.ref_audio, prompt.ref_sample_rate, prompt.ref_text = audio.astype(np.float32), rate, ref_text
    return prompt
