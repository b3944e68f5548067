"""OmniVoice's prompt: style tokens, the text, an optional voice to clone, the masked target.

    [<|denoise|>] <|lang_start|>{lang}<|lang_end|><|instruct_start|>{instruct}<|instruct_end|>
    <|text_start|>{ref_text + " " + text}<|text_end|>   [reference codes]   [target: all masked]

Text positions repeat the text token on every codebook row; audio positions (reference and
target) read their codes. `<|denoise|>` comes only with a cloned voice (the authors' default).
How long the target is comes from the text (`estimate_frames`): the authors' rule-based
estimator, which weighs characters by script and scales by a reference utterance's pace.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from functools import lru_cache

import torch

# The authors' non-verbal tags: tokenized alone so that their ids do not depend on the text around them.
NONVERBAL = re.compile(r"\[(laughter|sigh|confirmation-en|question-en|question-ah|question-oh|question-ei|"
                       r"question-yi|surprise-ah|surprise-oh|surprise-wa|surprise-yo|dissatisfaction-hnn)\]")
_CJK = r"[\u4e00-\u9fff]"


def combine_text(text: str, ref_text: str | None = None) -> str:
    """The reference's transcript then the text, with the authors' whitespace clean-up."""
    full = f"{ref_text.strip()} {text.strip()}" if ref_text else text.strip()
    full = re.sub(r"[\r\n]+", "", full).replace("\uff08", "(").replace("\uff09", ")")
    full = re.sub(r"[ \t]+", " ", full)
    return re.sub(rf"(?<={_CJK})\s+|\s+(?={_CJK})", "", full)


def text_ids(tokenizer, text: str) -> list[int]:
    """`text` tokenized piece by piece around its non-verbal tags."""
    ids: list[int] = []
    last = 0
    for m in NONVERBAL.finditer(text):
        ids += tokenizer(text[last:m.start()], add_special_tokens=False).input_ids if m.start() > last else []
        ids += tokenizer(m.group(), add_special_tokens=False).input_ids
        last = m.end()
    if last < len(text):
        ids += tokenizer(text[last:], add_special_tokens=False).input_ids
    return ids or tokenizer(text).input_ids


def conditional_inputs(tokenizer, num_codebooks: int, mask_id: int, text: str, num_frames: int,
                       ref_text: str | None = None, ref_codes: torch.Tensor | None = None,
                       language: str | None = None, instruct: str | None = None,
                       denoise: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [codebooks, S], audio_mask [S]) of one request; the target is its last `num_frames`."""
    style = "<|denoise|>" if denoise and ref_codes is not None else ""
    style += f"<|lang_start|>{language or 'None'}<|lang_end|><|instruct_start|>{instruct or 'None'}<|instruct_end|>"
    style_ids = tokenizer(style).input_ids
    body_ids = text_ids(tokenizer, f"<|text_start|>{combine_text(text, ref_text)}<|text_end|>")
    text_part = torch.tensor(style_ids + body_ids, dtype=torch.long).repeat(num_codebooks, 1)
    audio = [ref_codes.long()] if ref_codes is not None else []
    audio.append(torch.full((num_codebooks, num_frames), mask_id, dtype=torch.long))
    input_ids = torch.cat([text_part, *audio], dim=1)
    audio_mask = torch.zeros(input_ids.shape[1], dtype=torch.bool)
    audio_mask[text_part.shape[1]:] = True
    return input_ids, audio_mask


# -- how long the speech is ----------------------------------------------------------------

_WEIGHTS = {"cjk": 3.0, "hangul": 2.5, "kana": 2.2, "ethiopic": 3.0, "yi": 3.0, "indic": 1.8, "thai_lao": 1.5,
            "khmer_myanmar": 1.8, "arabic": 1.5, "hebrew": 1.5, "latin": 1.0, "cyrillic": 1.0, "greek": 1.0,
            "armenian": 1.0, "georgian": 1.0, "punctuation": 0.5, "space": 0.2, "digit": 3.5, "mark": 0.0,
            "default": 1.0}
# The authors' Unicode blocks: (last code point, script), in order.
_BLOCKS = [
    (0x02AF, "latin"), (0x03FF, "greek"), (0x052F, "cyrillic"), (0x058F, "armenian"), (0x05FF, "hebrew"),
    (0x077F, "arabic"), (0x089F, "arabic"), (0x08FF, "arabic"), (0x097F, "indic"), (0x09FF, "indic"),
    (0x0A7F, "indic"), (0x0AFF, "indic"), (0x0B7F, "indic"), (0x0BFF, "indic"), (0x0C7F, "indic"),
    (0x0CFF, "indic"), (0x0D7F, "indic"), (0x0DFF, "indic"), (0x0EFF, "thai_lao"), (0x0FFF, "indic"),
    (0x109F, "khmer_myanmar"), (0x10FF, "georgian"), (0x11FF, "hangul"), (0x137F, "ethiopic"),
    (0x139F, "ethiopic"), (0x13FF, "default"), (0x167F, "default"), (0x169F, "default"), (0x16FF, "default"),
    (0x171F, "default"), (0x173F, "default"), (0x175F, "default"), (0x177F, "default"),
    (0x17FF, "khmer_myanmar"), (0x18AF, "default"), (0x18FF, "default"), (0x194F, "indic"), (0x19DF, "indic"),
    (0x19FF, "khmer_myanmar"), (0x1A1F, "indic"), (0x1AAF, "indic"), (0x1B7F, "indic"), (0x1BBF, "indic"),
    (0x1BFF, "indic"), (0x1C4F, "indic"), (0x1C7F, "indic"), (0x1C8F, "cyrillic"), (0x1CBF, "georgian"),
    (0x1CCF, "indic"), (0x1CFF, "indic"), (0x1D7F, "latin"), (0x1DBF, "latin"), (0x1DFF, "default"),
    (0x1EFF, "latin"), (0x309F, "kana"), (0x30FF, "kana"), (0x312F, "cjk"), (0x318F, "hangul"), (0x9FFF, "cjk"),
    (0xA4CF, "yi"), (0xA4FF, "default"), (0xA63F, "default"), (0xA69F, "cyrillic"), (0xA6FF, "default"),
    (0xA7FF, "latin"), (0xA82F, "indic"), (0xA87F, "default"), (0xA8DF, "indic"), (0xA8FF, "indic"),
    (0xA92F, "indic"), (0xA95F, "indic"), (0xA97F, "hangul"), (0xA9DF, "indic"), (0xA9FF, "khmer_myanmar"),
    (0xAA5F, "indic"), (0xAA7F, "khmer_myanmar"), (0xAADF, "indic"), (0xAAFF, "indic"), (0xAB2F, "ethiopic"),
    (0xAB6F, "latin"), (0xABBF, "default"), (0xABFF, "indic"), (0xD7AF, "hangul"), (0xFAFF, "cjk"),
    (0xFDFF, "arabic"), (0xFE6F, "default"), (0xFEFF, "arabic"), (0xFFEF, "latin"),
]
_BREAKPOINTS = [end for end, _ in _BLOCKS]
# Without a voice to clone, the pace of this utterance in this many frames.
DEFAULT_PACE = ("Nice to meet you.", 25)


@lru_cache(maxsize=4096)
def _char_weight(char: str) -> float:
    code = ord(char)
    if 65 <= code <= 90 or 97 <= code <= 122:
        return _WEIGHTS["latin"]
    if code == 32:
        return _WEIGHTS["space"]
    category = unicodedata.category(char)
    if code == 0x0640 or category.startswith("M"):
        return _WEIGHTS["mark"]
    for prefix, kind in (("P", "punctuation"), ("S", "punctuation"), ("Z", "space"), ("N", "digit")):
        if category.startswith(prefix):
            return _WEIGHTS[kind]
    index = bisect.bisect_left(_BREAKPOINTS, code)
    if index < len(_BLOCKS):
        return _WEIGHTS[_BLOCKS[index][1]]
    return _WEIGHTS["cjk"] if code > 0x20000 else _WEIGHTS["default"]


def text_weight(text: str) -> float:
    return sum(_char_weight(c) for c in text)


def estimate_frames(text: str, ref_text: str | None = None, ref_frames: int | None = None,
                    low_threshold: float = 50, boost: float = 3) -> int:
    """Target frames for `text` at the pace of (ref_text, ref_frames); short ones are lengthened
    along the authors' power curve below `low_threshold` frames."""
    if not ref_frames or not ref_text:
        ref_text, ref_frames = DEFAULT_PACE
    ref_weight = text_weight(ref_text)
    estimate = 0.0
    if ref_weight:
        estimate = text_weight(text) / (ref_weight / ref_frames)
        if estimate < low_threshold:
            estimate = low_threshold * (estimate / low_threshold) ** (1.0 / boost)
    return max(1, int(estimate))
