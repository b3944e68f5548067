"""What a CSM request says: the text, whose voice speaks it, and an optional reference clip.

CSM conditions on a speaker id written into the prompt (`[0]Hello.`) and, for voice
cloning, on a context turn before it: the reference clip's transcript and its audio
codes, spoken by the same speaker. So:

- a built-in voice is a named speaker id (`BUILTIN_VOICES`);
- a cloned voice is a reference clip (`ref_audio`, any sample rate, mono float) with its
  transcript (`ref_text`, may be empty), prepended as a context turn.

Prompts are a str (the text, default voice) or a dict with the keys in `PROMPT_KEYS`.
Every problem is a RequestError naming the key (HTTP 400).
Torch-free: the server and the family registration import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from omnistage.core.errors import RequestError
from omnistage.models.talker_codec.reference_clip import reference_clip
from omnistage.models.talker_codec.request import speech_request, text_to_speak

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
    inputs = speech_request(inputs, "CSM", PROMPT_KEYS, refused=("instructions",))
    if "instructions" in inputs:
        raise RequestError("instructions", "instructions: CSM does not follow instructions; choose a voice, or clone one")
    text = text_to_speak(inputs)
    voice = inputs.get("voice")
    voice = DEFAULT_VOICE if voice is None else voice
    if voice not in BUILTIN_VOICES:
        raise RequestError("voice", f"voice: unknown voice {voice!r}; built-in voices: {', '.join(BUILTIN_VOICES)}")
    prompt = CsmPrompt(text=text, speaker=BUILTIN_VOICES[voice])
    clip = reference_clip(inputs)
    if clip is not None:
        prompt.ref_audio, prompt.ref_sample_rate, prompt.ref_text = clip.audio, clip.sample_rate, clip.text
    return prompt
