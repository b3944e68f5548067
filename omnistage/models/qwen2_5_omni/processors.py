"""How Qwen2.5-Omni's stages feed each other (run by the orchestrator, not the engines).

    request ──thinker_inputs──> thinker ──thinker_chunks (streamed)──> talker ──talker_chunks (streamed)──> token2wav

- `thinker_inputs`: the prompt as the AR engine takes it, plus the voice and the request
  for every position's hidden state and input embedding (what the talker reads), unless
  the request's `output_modalities` leave out audio (then no talker runs).
- `talker_inputs`: the talker's prefill embeddings and reply rows, built from the
  thinker's finished output exactly as `Qwen2_5OmniForConditionalGeneration.generate` does
  (the whole hand-off).
- `thinker_chunks`: the same rows as the thinker makes them, so the talker starts after
  the thinker's second token and follows it (`qwen_omni.handoff.talker_stream_inputs` passes them on).
- `talker_chunks`: cuts the talker's codes into chunks with context for token2wav,
  one engine request each (see `Token2WavParams` for chunk size and context).

Stateless: each call reads only its arguments, so a request can be retried or streamed
over any connector. Torch is imported inside the functions that touch tensors.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from omnistage.models.qwen2_5_omni.params import Token2WavParams
from omnistage.models.qwen_omni.handoff import omni_thinker_inputs

THINKER, TALKER, TOKEN2WAV = 0, 1, 2
DEFAULT_VOICE = "Chelsie"  # the reference generate()'s default speaker


@dataclass(frozen=True)
class ChunkOptions:
    """What token2wav needs besides the codes of one chunk (its engine request's `options`).

    A chunk's `codes` are frames [offset, offset + len(codes)) of the utterance: the
    frames it voices, [start, end), with left and right context around them.
    """

    offset: int
    start: int
    end: int
    voice: str
    seed: int
    """Noise seed of the whole utterance: every chunk of a request has the same."""
    params: Token2WavParams


# --- thinker -----------------------------------------------------------------------------


def thinker_inputs(request: Any, upstream: dict) -> dict:
    """Prompt -> thinker inputs, asking for what the talker needs (see `omni_thinker_inputs`)."""
    return omni_thinker_inputs(request, DEFAULT_VOICE)


# --- thinker -> talker -----------------------------------------------------------------------


def talker_inputs(request: Any, upstream: dict) -> dict:
    """The thinker's finished output -> talker inputs (reference: `generate()`, "2. Generate speech tokens").

    The thinker returns one hidden state and one input embedding per fed position: the L
    prompt positions, then one per generated token but the last (never fed back). Their
    sums are the talker's thinker-side inputs:

        prefill  = [prompt rows (L), voice text-BOS embedding, reply row 0]
        reply    = [reply rows 1.., tts_text_eos embedding, tts_text_pad embedding]

    so talker decode step k reads reply[k], and the pad row once the reply is spoken.
    """
    import torch

    out = upstream[THINKER]
    hidden, embeds = out.hidden_states, out.extras.get("input_embeds")
    special = out.extras.get("talker_embeds")
    if hidden is None or embeds is None or special is None:
        raise ValueError("the thinker output has no hidden states / input embeddings for the talker")
    positions = out.extras["mrope_positions"]
    num_prompt = positions.shape[1]
    rows = hidden + embeds
    voice_bos, text_eos, text_pad = special[0:1], special[1:2], special[2:3]
    reply = rows[num_prompt:]
    if reply.shape[0] == 0:
        # NOTE: the thinker stopped on its first token, so there is no reply row to start the
        # talker with; the reference generate() fails here. Speak the end of text instead.
        reply = text_eos
    return {
        "prompt_embeds": torch.cat([rows[:num_prompt], voice_bos, reply[:1]]),
        "reply_embeds": torch.cat([reply[1:], text_eos, text_pad]),
        "mrope_positions": positions,
        "rope_delta": out.extras["rope_delta"],
    }


def thinker_chunks(request: Any, payload: Any, finished: bool) -> dict | None:
    """One thinker output -> the talker's input so far: its streamed start, or the next rows.

    The thinker's first output carries the L prompt rows (hidden state + input embedding):
    they start the talker's request, `prompt_embeds = [prompt rows, voice text-BOS]`, still
    missing reply row 0. Each later output carries one reply row (the token it fed), sent as
    `{"reply_rows", "final"}`; the final one appends tts_text_eos and tts_text_pad. So the
    talker gets the rows `talker_inputs` builds from the whole output, in the same order.
    A thinker that stops at its first token gets the whole hand-off at once.
    """
    import torch

    if payload is None:
        return None
    hidden, embeds = payload.extras.get("delta_hidden_states"), payload.extras.get("delta_input_embeds")
    special = payload.extras.get("talker_embeds")
    if hidden is None or embeds is None or special is None:
        raise ValueError("the thinker output has no hidden states / input embeddings for the talker")
    rows = hidden + embeds
    text_eos, text_pad = special[1:2], special[2:3]
    if len(payload.token_ids) == len(payload.delta_token_ids):  # the first output: the prompt rows
        if finished:
            return talker_inputs(request, {THINKER: payload})
        return {
            "prompt_embeds": torch.cat([rows, special[0:1]]),
            "reply_embeds": rows[:0],
            "mrope_positions": payload.extras["mrope_positions"],
            "rope_delta": payload.extras["rope_delta"],
            "streamed": True,
        }
    if finished:
        rows = torch.cat([rows, text_eos, text_pad])
    return {"reply_rows": rows, "final": finished}


# --- talker -> token2wav -----------------------------------------------------------------------


def talker_chunks(request: Any, payload: Any, finished: bool) -> dict | None:
    """The talker's output so far -> the next token2wav request `{"codes", "options"}`, or None.

    Chunk boundaries are 0, F, F + C, F + 2C, ... (C = chunk_size, F = first_chunk_size or
    C); the chunk ending at boundary b is sent once b + its right context frames exist
    (first_right_context for the first chunk, right_context after); when the talker
    finishes, everything not yet sent goes in one last chunk.
    Which chunks were sent before follows from the frame count of the previous call (this
    payload minus its new tokens), so nothing is remembered between calls.
    """
    if payload is None:
        return None  # the talker ended without a new output; its last one already flushed
    params = request.params.get(TOKEN2WAV) or Token2WavParams()
    if not isinstance(params, Token2WavParams):
        raise TypeError(f"token2wav params must be Token2WavParams, got {type(params).__name__}")
    codes = payload.token_ids
    num_before = len(codes) - len(payload.delta_token_ids)
    # The codec pad/end token that stopped the talker is not a frame to voice.
    num_codes = len(codes) - 1 if finished and payload.finish_reason == "stop" and codes else len(codes)
    size, left, right = params.chunk_size, params.left_context, params.right_context
    first = params.first_chunk_size or size
    first_right = right if params.first_right_context is None else params.first_right_context

    def sent_by(frames: int) -> int:
        """The last chunk boundary sent once `frames` frames exist (0: none yet, or not chunking)."""
        if size == 0 or frames < first + first_right:
            return 0
        if frames < first + size + right:
            return first
        return first + (frames - right - first) // size * size

    sent = sent_by(num_before)
    if finished:
        end = window_end = num_codes
        if end <= sent and sent > 0:
            return None  # everything was sent already (no right context)
    else:
        end = sent_by(num_codes)
        if end <= sent:
            return None
        window_end = min(num_codes, end + (first_right if end == first else right))
    offset = max(0, sent - left)
    prompt = request.prompt if isinstance(request.prompt, dict) else {}
    seed = params.seed if params.seed is not None else zlib.crc32(request.request_id.encode())
    options = ChunkOptions(offset=offset, start=sent, end=end, voice=prompt.get("voice") or DEFAULT_VOICE,
                           seed=seed, params=params)
    return {"codes": codes[offset:window_end], "options": options}
