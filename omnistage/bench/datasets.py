"""Prompts for the serving benchmark: random word salads, or a JSONL file."""

from __future__ import annotations

import json
import random
from pathlib import Path

_WORDS = ("a photo of cat dog mountain lake sunrise astronaut horse moon watercolor painting robot city "
          "night neon forest river portrait of an old man the quick brown fox jumps over lazy").split()


def random_prompts(num: int, seed: int = 0, min_words: int = 4, max_words: int = 16) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(min_words, max_words)))}
            for _ in range(num)]


def file_prompts(path: str | Path, num: int) -> list[dict]:
    """Each line a JSON object with at least "prompt"; other keys are sent as request fields.
    Lines are reused in order when the file has fewer than `num`."""
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{path}:{i}: each line must be a JSON object with a string 'prompt'")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return [rows[i % len(rows)] for i in range(num)]
