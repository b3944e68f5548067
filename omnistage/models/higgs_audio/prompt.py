"""What a Higgs-Audio v2 request says: the text, and optionally how the scene sounds.

Higgs-Audio has no named speakers: without a reference clip the model picks a voice that
suits the text and the scene ("smart voice"). A request is a str (the text) or a dict:

    prompt        the text to speak (required)
    instructions  the scene description, as the model card's `scene` turn ("Audio is
                  recorded from a quiet room."); default `DEFAULT_SCENE`
    voice         ignored: there are no built-in voices (OpenAI clients always send one)

The system turn is the model card's `SYSTEM_PROMPT`. Every problem is a RequestError naming
the key (HTTP 400). Torch-free: the family registration imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omnistage.core.errors import RequestError

PROMPT_KEYS = ("prompt", "instructions", "voice")
SYSTEM_PROMPT = "Generate audio following instruction."
DEFAULT_SCENE = "Audio is recorded from a quiet room."


@dataclass
class HiggsPrompt:
    text: str
    scene: str

    def conversation(self) -> list[dict]:
        """The chat the processor's template renders (the model card's single-speaker example)."""
        return [{"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
                {"role": "scene", "content": [{"type": "text", "text": self.scene}]},
                {"role": "user", "content": [{"type": "text", "text": self.text}]}]


def parse_prompt(inputs: Any) -> HiggsPrompt:
    if isinstance(inputs, str):
        inputs = {"prompt": inputs}
    if not isinstance(inputs, Mapping):
        raise RequestError("prompt", f"prompt: Higgs-Audio takes a str or a dict with keys {list(PROMPT_KEYS)}, "
                           f"got {type(inputs).__name__}")
    for key in ("ref_audio", "ref_sample_rate", "ref_text"):
        if inputs.get(key) is not None:
            raise RequestError(key, f"{key}: this server does not clone voices with Higgs-Audio yet")
    unknown = sorted(set(inputs) - set(PROMPT_KEYS) - {"ref_audio", "ref_sample_rate", "ref_text"})
    if unknown:
        raise RequestError(unknown[0], f"{unknown[0]}: unknown Higgs-Audio prompt key; expected {list(PROMPT_KEYS)}")
    text = inputs.get("prompt")
    if not isinstance(text, str) or not text.strip():
        raise RequestError("prompt", "prompt: the text to speak must be a non-empty string")
    scene = inputs.get("instructions")
    if scene is None:
        scene = DEFAULT_SCENE
    if not isinstance(scene, str) or not scene.strip():
        raise RequestError("instructions", "instructions: the scene description must be a non-empty string")
    return HiggsPrompt(text, scene)
