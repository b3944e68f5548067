"""The media parts of chat messages, as the AR families that hear or see take them (the Qwen
omni thinkers, Qwen3-ASR): `{"type": "audio", "audio", "sample_rate"}`, `{"type": "image",
"image"}` and `{"type": "video", "video", ...}` (see `qwen_omni.video`). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ChatMedia:
    """The media parts of a chat, each kind in prompt order."""

    audios: list[tuple[Any, int]] = field(default_factory=list)
    """(waveform, sample rate) per audio part."""
    images: list[Any] = field(default_factory=list)
    """PIL image or uint8 [H, W, 3] array per image part."""
    videos: list[dict] = field(default_factory=list)
    """The video parts as given (see `qwen_omni.video`: encoded bytes or frames + fps)."""


def chat_media(inputs: Any) -> ChatMedia:
    """The media parts of the chat messages: `{"type": "audio", "audio", "sample_rate"}`,
    `{"type": "image", "image"}` and `{"type": "video", "video", ...}` (see `qwen_omni.video`)."""
    media = ChatMedia()
    if not isinstance(inputs, dict) or not isinstance(inputs.get("messages"), list):
        return media
    for message in inputs["messages"]:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "audio":
                if "sample_rate" not in part:
                    raise ValueError("an audio part needs 'audio' (float waveform) and 'sample_rate'")
                media.audios.append((part["audio"], int(part["sample_rate"])))
            elif kind == "image":
                if part.get("image") is None:
                    raise ValueError("an image part needs 'image' (a PIL image or a uint8 [H, W, 3] array)")
                media.images.append(part["image"])
            elif kind == "video":
                if part.get("video") is None:
                    raise ValueError("a video part needs 'video' (encoded bytes, or uint8 [F, H, W, 3] frames "
                                     "with 'fps')")
                media.videos.append(part)
    return media
