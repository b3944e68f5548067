"""What a Fish Speech request says, and the prompt ids the slow transformer reads.

A request is a str (the text) or a dict:

    prompt         the text to speak (required); inline markers such as "(excited)" are text
    voice          ignored: the model has no built-in voices (OpenAI clients always send one)
    ref_audio, ref_sample_rate, ref_text, instructions
                   refused: cloning continues from the clip's codec codes, which need the
                   codec's encoder (not served yet), and the model takes no described voice

The prompt is the authors' `generate_long` without a reference: one interleaved content
sequence `<|interleave|>`, `<|speaker:0|>`, the text, each part tokenized on its own (their
`ContentSequence.encode`). Every problem is a RequestError naming the key (HTTP 400).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from omnistage.core.errors import RequestError
from omnistage.models.talker_codec.request import speech_request, text_to_speak

PROMPT_KEYS = ("prompt", "voice")
REFUSED_KEYS = ("ref_audio", "ref_sample_rate", "ref_text", "instructions")
IM_END = "<|im_end|>"

# The authors' pre-tokenizer pattern (fish_speech/tokenizer.py); the checkpoint stores only the ranks.
FISH_TIKTOKEN_PATTERN = "|".join([
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)", r"\p{P}", r"[^\r\n\p{L}\p{N}]?\p{L}+", r"\p{N}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*", r"\s*[\r\n]+", r"\s+(\?!\S)", r"\s+"])


class FishTokenizer:
    """The checkpoint's `tokenizer.tiktoken` (base64 byte ranks) and `special_tokens.json`."""

    def __init__(self, folder: str | Path) -> None:
        import tiktoken

        folder = Path(folder)
        ranks = {}
        for line in (folder / "tokenizer.tiktoken").read_text().splitlines():
            if line:
                token, rank = line.split()
                ranks[b"" if token == "=" else base64.b64decode(token)] = int(rank)
        self.special = json.loads((folder / "special_tokens.json").read_text())
        semantic = sorted(i for name, i in self.special.items() if name.startswith("<|semantic:"))
        if not semantic:
            raise ValueError(f"Fish Speech checkpoint: no <|semantic:N|> tokens in {folder / 'special_tokens.json'}")
        self.semantic_range = (semantic[0], semantic[-1])
        self.im_end_id = self.special[IM_END]
        self.encoding = tiktoken.Encoding(name=folder.name, pat_str=FISH_TIKTOKEN_PATTERN,
                                          mergeable_ranks=ranks, special_tokens=self.special)

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode(text, allowed_special="all", disallowed_special=())


def parse_prompt(inputs: Any) -> str:
    """The text to speak; every refused or unknown key is a RequestError naming it."""
    inputs = speech_request(inputs, "Fish Speech", PROMPT_KEYS, refused=REFUSED_KEYS)
    for key in REFUSED_KEYS:
        if inputs.get(key) is not None:
            raise RequestError(key, f"{key}: Fish Speech is served without voice cloning or described voices "
                                    "here (a cloned voice needs the codec's encoder); send the text only")
    return text_to_speak(inputs)


def prompt_ids(tokenizer: FishTokenizer, text: str) -> list[int]:
    return [t for part in ("<|interleave|>", "<|speaker:0|>", text) for t in tokenizer.encode(part)]
