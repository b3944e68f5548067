"""The conversation of one Realtime session: its items in order, and the chat messages
the model reads for the next response.

User audio stays a float32 waveform (at its input format's rate) so each response
reads it without decoding again; an assistant item is what the model said: the
transcript of its audio, cut at barge-in to what the client was sent, and for the latest
answer that audio (at the model's rate); after conversation.item.truncate, the audio the
client played and its transcript (input_transcription.heard_transcript).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_ITEM_ID = 64


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass
class Part:
    type: str
    """input_text | input_audio | output_text | output_audio."""
    text: str = ""
    """The text, or the transcript of an audio part."""
    audio: np.ndarray | None = None
    """A user's audio, which the model hears; the latest answer's audio as sent, which it does not (it reads
    the text), kept for conversation.item.truncate."""
    sample_rate: int = 0
    cuts: tuple[int, ...] = ()
    """Sample offsets where the audio is cut into clips the model hears one by one (a turn
    prefilled while the user spoke, turn_prefill.py); none: one clip."""

    def as_openai(self) -> dict[str, Any]:
        if self.type in ("input_text", "output_text"):
            return {"type": self.type, "text": self.text}
        return {"type": self.type, "transcript": self.text or None}


@dataclass
class Item:
    role: str
    parts: list[Part]
    id: str = field(default_factory=lambda: new_id("item"))
    status: str = "completed"

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "object": "realtime.item", "type": "message", "status": self.status,
                "role": self.role, "content": [p.as_openai() for p in self.parts]}


class Conversation:
    def __init__(self) -> None:
        self.items: list[Item] = []

    @property
    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def index_after(self, previous_item_id: str | None) -> int:
        """Where an item created after `previous_item_id` goes (None: at the end; "root": first)."""
        if previous_item_id is None:
            return len(self.items)
        if previous_item_id == "root":
            return 0
        for i, item in enumerate(self.items):
            if item.id == previous_item_id:
                return i + 1
        raise KeyError(previous_item_id)

    def insert(self, item: Item, index: int | None = None) -> str | None:
        """Add `item`; returns the id of the item before it."""
        index = len(self.items) if index is None else index
        self.items.insert(index, item)
        return self.items[index - 1].id if index > 0 else None

    def has(self, item_id: str) -> bool:
        return any(item.id == item_id for item in self.items)

    def get(self, item_id: str) -> Item:
        """The item, or a KeyError."""
        for item in self.items:
            if item.id == item_id:
                return item
        raise KeyError(item_id)

    def delete(self, item_id: str) -> None:
        self.items.remove(self.get(item_id))

    def forget_answer_audio(self) -> None:
        """Drop the answers' audio (kept for conversation.item.truncate of the latest answer only)."""
        for item in self.items:
            if item.role == "assistant":
                for part in item.parts:
                    part.audio = None

    def messages(self, instructions: str) -> list[dict[str, Any]]:
        """Chat messages for the model: the instructions as the system message, then the items."""
        out = [{"role": "system", "content": instructions}] if instructions else []
        for item in self.items:
            parts = []
            for p in item.parts:
                if p.audio is not None and item.role == "user":
                    parts += audio_parts(p.audio, p.sample_rate, p.cuts)
                elif p.text:
                    parts.append({"type": "text", "text": p.text})
            if not parts:
                continue  # an answer cancelled before its first word
            if all(p["type"] == "text" for p in parts):
                out.append({"role": item.role, "content": "\n".join(p["text"] for p in parts)})
            else:
                out.append({"role": item.role, "content": parts})
        return out


def audio_parts(audio: np.ndarray, rate: int, cuts: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """Chat content parts for `audio` cut at `cuts`: one clip each."""
    bounds = [0, *cuts, len(audio)]
    return [{"type": "audio", "audio": audio[a:b], "sample_rate": rate} for a, b in zip(bounds, bounds[1:])]
