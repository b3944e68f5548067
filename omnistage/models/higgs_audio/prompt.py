"""What a Higgs-Audio v2 request says: the text, how the scene sounds, and whose voice.

Higgs-Audio has no named speakers: without a reference clip the model picks a voice that
suits the text and the scene ("smart voice"); with one it clones the clip's voice (the
model card's zero-shot cloning: the clip's transcript as a user turn, the clip as the
assistant's answer, then the text). A request is a str (the text) or a dict:

    prompt           the text to speak (required)
    instructions     the scene description, as the model card's `scene` turn ("Audio is
                     recorded from a quiet room."); default `DEFAULT_SCENE`
    ref_audio        a mono float clip to clone (with ref_sample_rate, Hz), at most
                     60 s (reference_clip.py); ref_text its transcript (may be empty)
    voice            ignored: there are no built-in voices (OpenAI clients always send one)

The system turn is the model card's `SYSTEM_PROMPT`. Every problem is a RequestError naming
the key (HTTP 400). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnistage.core.errors import RequestError
from omnistage.models.talker_codec.reference_clip import reference_clip
from omnistage.models.talker_codec.request import speech_request, text_to_speak

PROMPT_KEYS = ("prompt", "instructions", "voice", "ref_audio", "ref_sample_rate", "ref_text")
SYSTEM_PROMPT = "Generate audio following instruction."
DEFAULT_SCENE = "Audio is recorded from a quiet room."


@dataclass
class HiggsPrompt:
    text: str
    scene: str
    ref_audio: np.ndarray | None = None
    """float32 mono clip to clone at `ref_sample_rate`, or None."""
    ref_sample_rate: int | None = None
    ref_text: str = ""

    def conversation(self) -> list[dict]:
        """The chat the processor's template renders (the model card's examples); a cloned voice's
        clip is the assistant's audio turn (its `{"type": "audio"}` part)."""
        chat = [{"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
                {"role": "scene", "content": [{"type": "text", "text": self.scene}]}]
        if self.ref_audio is not None:
            chat += [{"role": "user", "content": [{"type": "text", "text": self.ref_text}]},
                     {"role": "assistant", "content": [{"type": "audio"}]}]
        return chat + [{"role": "user", "content": [{"type": "text", "text": self.text}]}]


def parse_prompt(inputs: Any) -> HiggsPrompt:
    inputs = speech_request(inputs, "Higgs-Audio", PROMPT_KEYS)
    text = text_to_speak(inputs)
    scene = inputs.get("instructions")
    if scene is None:
        scene = DEFAULT_SCENE
    if not isinstance(scene, str) or not scene.strip():
        raise RequestError("instructions", "instructions: the scene description must be a non-empty string")
    return HiggsPrompt(text, scene, *_reference(inputs))


def _reference(inputs: Mapping[str, Any]) -> tuple:
    """(ref_audio, ref_sample_rate, ref_text), checked; (None, None, "") without a clip."""
    clip = reference_clip(inputs)
    return (None, None, "") if clip is None else (clip.audio, clip.sample_rate, clip.text)
