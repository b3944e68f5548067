"""What a MOSS-TTS request says, and the prompt text the model reads.

MOSS-TTS has no named speakers. A request is a str (the text) or a dict:

    prompt         the text to speak (required); normalised as the authors' (normalizer.py)
    language       the spoken language, as the model card names it (e.g. "English",
                   "Chinese"): the prompt's Language field
    instructions   the voice and style described in words: the prompt's Instruction field
    voice          ignored: there are no built-in voices (OpenAI clients always send one)
    ref_audio, ref_sample_rate, ref_text
                   refused: cloning continues from the clip's MOSS-Audio-Tokenizer codes,
                   which need the tokenizer's encoder; the authors' package ships the decoder only

The prompt is the authors' `build_tts_prompt`: one user turn holding the `<user_inst>`
block (every unset field the literal "None"), then an open assistant turn. Every problem is
a RequestError naming the key (HTTP 400). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omnistage.core.errors import RequestError
from omnistage.models.moss_tts.normalizer import normalize_tts_text
from omnistage.models.talker_codec.request import speech_request

PROMPT_KEYS = ("prompt", "language", "instructions", "voice")
CLONE_KEYS = ("ref_audio", "ref_sample_rate", "ref_text")

_USER_INST = ("<user_inst>\n- Reference(s):\n{reference}\n- Instruction:\n{instruction}\n"
              "- Tokens:\n{tokens}\n- Quality:\n{quality}\n- Sound Event:\n{sound_event}\n"
              "- Ambient Sound:\n{ambient_sound}\n- Language:\n{language}\n- Text:\n{text}\n"
              "</user_inst>")


@dataclass
class MossPrompt:
    text: str
    """The normalised text."""
    language: str | None = None
    instructions: str | None = None

    def render(self) -> str:
        """The chat text the tokenizer reads."""
        content = _USER_INST.format(reference=None, instruction=self.instructions, tokens=None, quality=None,
                                    sound_event=None, ambient_sound=None, language=self.language, text=self.text)
        return f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"


def _optional_text(inputs: Mapping, key: str) -> str | None:
    value = inputs.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise RequestError(key, f"{key}: must be a non-empty string")
    return value.strip()


def parse_prompt(inputs: Any) -> MossPrompt:
    inputs = speech_request(inputs, "MOSS-TTS", PROMPT_KEYS, refused=CLONE_KEYS)
    for key in CLONE_KEYS:
        value = inputs.get(key)
        if value is not None and not (isinstance(value, str) and not value):
            raise RequestError(key, f"{key}: MOSS-TTS clones a voice from its audio tokenizer's codes of the clip, "
                                    "and this model's audio tokenizer has no encoder; send no reference clip")
    text = inputs.get("prompt")
    if not isinstance(text, str) or not normalize_tts_text(text):
        raise RequestError("prompt", "prompt: the text to speak must be a non-empty string")
    return MossPrompt(normalize_tts_text(text), _optional_text(inputs, "language"),
                      _optional_text(inputs, "instructions"))
