"""What the model reads: the session's past turns, then the turn being built.

NOTE on the layout: the prompt only ever grows at its end. A turn is its frames in
arrival order, then its audio, then the question; past turns never change. So the prompt
of the frames buffered so far (`messages(frames)`, no question yet) is a prefix of the
next query's prompt up to the last frame, and the thinker's prefix cache holds its keys
and values when the query comes (see ../prefix_warmer.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnistage.entrypoints.openai.video_chat.frames import Frame


@dataclass
class Turn:
    frames: list[Frame]
    audio: list[tuple[np.ndarray, int]] = field(default_factory=list)
    """(waveform, rate): the stream's audio since the last query, then the spoken question."""
    question: str = ""
    answer: str = ""


def user_content(frames: list[Frame], audio: list[tuple[np.ndarray, int]], question: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image", "image": f.pixels} for f in frames]
    parts += [{"type": "audio", "audio": wave, "sample_rate": rate} for wave, rate in audio]
    if question:
        parts.append({"type": "text", "text": question})
    return parts


class Context:
    def __init__(self) -> None:
        self.system_prompt = ""
        self.turns: list[Turn] = []

    def messages(self, current: Turn | None) -> list[dict[str, Any]]:
        """Chat messages: the system prompt, every past turn with its answer, then `current`
        (without an answer: the model writes it)."""
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for turn in [*self.turns, *([current] if current is not None else [])]:
            content = user_content(turn.frames, turn.audio, turn.question)
            if content:
                out.append({"role": "user", "content": content})
            if turn.answer:
                out.append({"role": "assistant", "content": turn.answer})
        return out
