"""Request params of Qwen3-Omni's code2wav stage (torch-free: users and the server import it cheaply).

    omni.generate(prompt, {"thinker": SamplingParams(max_tokens=64),
                           "code2wav": Code2WavParams(chunk_frames=25)})

The voice is not a param: it is part of the prompt (`{"messages": [...], "voice": "Ethan"}`),
because the thinker checks it and the talker speaks with it.

NOTE: these are read by the talker's chunk processor, which runs in the orchestrator; a
request without them gets these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnistage.models.talker_codec.chunks import FrameChunkParams


@dataclass(frozen=True)
class Code2WavParams(FrameChunkParams):
    """How the talker's frames are cut into code2wav chunks (12.5 frames/s): `FrameChunkParams`
    with Qwen3-Omni's defaults.

    Code2wav is causal (causal convolutions, sliding-window causal attention) and carries its
    state from chunk to chunk, so a chunk costs its own frames and the streamed waveform equals
    the one-shot decode, whatever the chunking. `chunk_frames=0` decodes the whole utterance in
    one pass once the talker has finished (the reference `generate`, for utterances up to 300
    frames).
    """

    first_chunk_frames: int = 5
    """Frames in the first chunk (>= 1; 0.4 s)."""
    chunk_frames: int = 25
    """Frames in each later chunk (>= 1, 2 s), or 0 for one pass over the whole utterance."""
