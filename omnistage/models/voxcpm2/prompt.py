"""What a VoxCPM2 request says: the text, a designed voice, or a voice to clone.

VoxCPM2 has no named speakers. A request is a str (the text) or a dict:

    prompt           the text to speak (required)
    instructions     voice design: a description of the voice and style, which the model reads
                     as a parenthesised prefix of the text, "(instructions)text", as the
                     authors' CLI `--control`
    ref_audio        a mono float clip to clone (with ref_sample_rate, Hz), at most 60 s
                     (reference_clip.py). Alone: the authors' reference mode (the clip's
                     latents in an isolated [ref_start .. ref_end] prefix); instructions may
                     steer it further
    ref_text         the clip's transcript: the authors' reference + continuation mode (the
                     clip is also the prompt the speech continues from, after its transcript);
                     not with instructions (the CLI refuses --control with a prompt text)
    voice            ignored: there are no built-in voices (OpenAI clients always send one)

Every problem is a RequestError naming the key (HTTP 400). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from omnistage.core.errors import RequestError
from omnistage.models.talker_codec.reference_clip import reference_clip
from omnistage.models.talker_codec.request import speech_request, text_to_speak

PROMPT_KEYS = ("prompt", "instructions", "voice", "ref_audio", "ref_sample_rate", "ref_text")


@dataclass
class VoxPrompt:
    text: str
    """The target text, with a designed voice's "(instructions)" prefix."""
    ref_audio: np.ndarray | None = None
    ref_sample_rate: int | None = None
    ref_text: str = ""
    """A cloned clip's transcript: non-empty = continuation mode."""

    @property
    def mode(self) -> str:
        if self.ref_audio is None:
            return "zero_shot"
        return "ref_continuation" if self.ref_text else "reference"


def parse_prompt(inputs: Any) -> VoxPrompt:
    inputs = speech_request(inputs, "VoxCPM2", PROMPT_KEYS)
    text = text_to_speak(inputs)
    control = inputs.get("instructions")
    if control is not None and (not isinstance(control, str) or not control.strip()):
        raise RequestError("instructions", "instructions: the voice description must be a non-empty string")
    clip = reference_clip(inputs)
    if control is not None and clip is not None and clip.text:
        raise RequestError("instructions", "instructions: VoxCPM2 cannot design a voice that continues a cloned "
                                           "clip with its transcript (ref_text); drop one of them")
    # The authors' generate: newlines become spaces and runs of whitespace one space.
    text = " ".join(text.split())
    if control is not None:
        text = f"({control.strip()}){text}"
    if clip is None:
        return VoxPrompt(text)
    return VoxPrompt(text, clip.audio, clip.sample_rate, clip.text)
