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
from omnistage.models.reference_clip import reference_clip
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# OpenAI's voice names, so that OpenAI clients work unchanged; each is one CSM speaker id.
BUILTIN_VOICES: dict[str, int] = {"alloy": 0, "echo": 1, "fable": 2, "onyx": 3, "nova": 4, "shimmer": 5}
DEFAULT_VOICE = "alloy"
PROMPT_KEYS = ("prompt", "voice", "ref_audio", "ref_sample_rate", "ref_text")


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
    clip = reference_clip(inputs)
    if clip is not None:
        prompt.ref_audio, prompt.ref_sample_rate, prompt.ref_text = clip.audio, clip.sample_rate, clip.text
    return prompt
