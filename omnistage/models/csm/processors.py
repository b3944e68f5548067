"""How CSM's talker feeds its codec (run by the orchestrator, not the engines).

    request ──(prompt as given)──> talker ──talker_chunks (streamed)──> codec

The codec stage is the generic Mimi decoder (`generation/mimi.py`), which keeps each
stream's state (transformer KV cache, convolution context, transposed-convolution
tails) from part to part, so chunked audio equals a one-shot decode: the chunks need no
overlap. Each chunk is one codec engine request (a "part" of stream `request_id`):

    {"codes": [frames, num_codebooks], "stream_id": request_id, "is_last": bool}

Stateless: which frames were sent before follows from the previous frame count.
"""

from __future__ import annotations

from typing import Any

from omnistage.models.csm.params import CsmCodecParams

TALKER, CODEC = 0, 1


def talker_chunks(request: Any, payload: Any, finished: bool) -> dict | None:
    """The talker's output so far -> the next chunk of frames for the codec, or None.

    Chunk boundaries are at `first_chunk_frames`, then every `chunk_frames` frames; a chunk
    is sent as soon as the talker's frame count passes a boundary, and when the talker
    finishes, whatever is left goes in a last chunk (possibly empty: it closes the stream).
    """
    codes = payload.extras.get("audio_codes") if payload is not None else None
    if codes is None:
        return None  # an aborted or failed talker: the orchestrator drops the codec stream
    params = request.params.get(CODEC) or CsmCodecParams()
    num_frames = codes.shape[0]
    sent = params.boundary(num_frames - payload.extras.get("num_new_frames", 0))
    end = num_frames if finished else params.boundary(num_frames)
    if end <= sent and not finished:
        return None
    return {"codes": codes[sent:end].clone(), "stream_id": request.request_id, "is_last": finished}
