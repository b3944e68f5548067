"""How Qwen3-TTS's talker feeds its codec (run by the orchestrator, not the engines).

    request ──(prompt as given)──> talker ──talker_chunks (streamed)──> codec

Chunking is Qwen3-Omni's (`qwen3_omni.processors.frame_chunks`, sized by `Code2WavParams`
given as the request's "codec" params).
"""

from __future__ import annotations

from typing import Any

from omnistage.models.qwen3_omni.processors import frame_chunks

TALKER, CODEC = 0, 1


def talker_chunks(request: Any, payload: Any, finished: bool) -> dict | None:
    return frame_chunks(request, payload, finished, CODEC)
