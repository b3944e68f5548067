"""What an OmniVoice speech request says. Torch-free.

OmniVoice has no named speakers. A request is a str (the text) or a dict:

    prompt         the text to speak (required)
    instructions   a designed voice: the authors' attribute items, comma-separated (English:
                   "female, low pitch, british accent"; Chinese with full-width commas:
                   "女，低音调，四川话"), at most one per category; a dialect makes the items
                   Chinese, an accent English, else they follow the text's script
    voice          ignored: there are no built-in voices (OpenAI clients always send one)
    ref_audio, ref_sample_rate, ref_text
                   a voice to clone: the clip and what it says (required: the authors
                   transcribe a clip without one with Whisper, which is not run here)

Every problem is a RequestError naming the key (HTTP 400).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from omnistage.core.errors import RequestError
from omnistage.models.talker_codec.reference_clip import ReferenceClip, reference_clip
from omnistage.models.talker_codec.request import speech_request, text_to_speak

PROMPT_KEYS = ("prompt", "instructions", "voice", "ref_audio", "ref_sample_rate", "ref_text")

# The authors' voice-design items (utils/voice_design.py): each category's items, English -> Chinese.
_CATEGORIES = (
    {"male": "男", "female": "女"},
    {"child": "儿童", "teenager": "少年", "young adult": "青年", "middle-aged": "中年", "elderly": "老年"},
    {"very low pitch": "极低音调", "low pitch": "低音调", "moderate pitch": "中音调", "high pitch": "高音调",
     "very high pitch": "极高音调"},
    {"whisper": "耳语"},
)
ACCENTS = frozenset(f"{a} accent" for a in ("american", "british", "australian", "chinese", "canadian", "indian",
                                            "korean", "portuguese", "russian", "japanese"))
DIALECTS = frozenset(f"{d}话" for d in ("河南", "陕西", "四川", "贵州", "云南", "桂林", "济南", "石家庄", "甘肃",
                                         "宁夏", "青岛", "东北"))
_EN_TO_ZH = {en: zh for category in _CATEGORIES for en, zh in category.items()}
_ZH_TO_EN = {zh: en for en, zh in _EN_TO_ZH.items()}
_EXCLUSIVE = [set(c) | set(c.values()) for c in _CATEGORIES] + [set(ACCENTS), set(DIALECTS)]
VALID_ITEMS = frozenset(_EN_TO_ZH) | frozenset(_ZH_TO_EN) | ACCENTS | DIALECTS
_CJK = re.compile(r"[\u4e00-\u9fff]")


@dataclass(frozen=True)
class OmniVoiceRequest:
    text: str
    instruct: str | None = None
    """The designed voice's items, normalised as the authors' (None: no design)."""
    clip: ReferenceClip | None = None


def parse_request(inputs: Any) -> OmniVoiceRequest:
    inputs = speech_request(inputs, "OmniVoice", PROMPT_KEYS)
    text = text_to_speak(inputs)
    clip = reference_clip(inputs, max_seconds=20.0)  # the authors warn above 20 s
    if clip is not None and not clip.text.strip():
        raise RequestError("ref_text", "ref_text: OmniVoice clones a voice from a clip and its transcript; "
                                       "send what the clip says")
    instructions = inputs.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("instructions", f"instructions: expected a string, got {type(instructions).__name__}")
    return OmniVoiceRequest(text, resolve_instruct(instructions, bool(_CJK.search(text))), clip)


def resolve_instruct(instructions: str | None, text_is_chinese: bool) -> str | None:
    """The authors' `_resolve_instruct`: items checked, one per category, in one language."""
    if instructions is None or not instructions.strip():
        return None
    items = [item.strip().lower() for item in re.split(r"\s*[,，]\s*", instructions.strip()) if item.strip()]
    unknown = [item for item in items if item not in VALID_ITEMS]
    if unknown:
        hints = [f"'{u}'" + (f" (did you mean '{m[0]}'?)" if (m := difflib.get_close_matches(u, VALID_ITEMS, 1, 0.6))
                             else "") for u in unknown]
        raise RequestError("instructions", f"instructions: unsupported voice item(s) {', '.join(hints)}; items: "
                                           f"{', '.join(sorted(VALID_ITEMS))}")
    has_dialect, has_accent = any(i in DIALECTS for i in items), any(i in ACCENTS for i in items)
    if has_dialect and has_accent:
        raise RequestError("instructions", "instructions: a Chinese dialect and an English accent do not mix")
    chinese = has_dialect or (not has_accent and text_is_chinese)
    items = [(_EN_TO_ZH if chinese else _ZH_TO_EN).get(i, i) for i in items]
    for group in _EXCLUSIVE:
        hits = [i for i in items if i in group]
        if len(hits) > 1:
            raise RequestError("instructions", f"instructions: at most one item per category, got {hits}")
    return ("，" if any(_CJK.search(i) for i in items) else ", ").join(items)
