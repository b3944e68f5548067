"""How Qwen3-Omni's stages feed each other (run by the orchestrator, not the engines).

    request ──thinker_inputs──> thinker ──thinker_chunks (streamed)──> talker ──talker_chunks (streamed)──> code2wav

- `thinker_inputs`: the prompt as the AR engine takes it, plus the voice and the request
  for every position's hidden state and input embedding (what the talker reads), unless
  the request's `output_modalities` leave out audio (then no talker runs).
- `talker_inputs`: the thinker's finished output, as the talker's `build_prompt` takes it
  (the projections into the talker's width need the talker's weights, so they run there):
  the whole hand-off.
- `thinker_chunks`: the same rows as the thinker makes them, so the talker starts after the
  thinker's second token and follows it (`qwen_omni.handoff.talker_stream_inputs` passes them on).
- `talker_chunks`: the talker's frames so far -> the next part of the code2wav stream
  (`models.talker_codec`'s `FrameChunks`, sized by `Code2WavParams`).

Stateless: each call reads only its arguments. Torch-free at import.
"""

from __future__ import annotations

from typing import Any

from omnistage.models.qwen3_omni.params import Code2WavParams
from omnistage.models.qwen_omni.handoff import omni_thinker_inputs
from omnistage.models.talker_codec import FrameChunks

THINKER, TALKER, CODE2WAV = 0, 1, 2
DEFAULT_VOICE = "Ethan"  # the reference generate()'s default speaker


# --- thinker -----------------------------------------------------------------------------


def thinker_inputs(request: Any, upstream: dict) -> dict:
    """Prompt -> thinker inputs, asking for what the talker needs (`qwen_omni.handoff`)."""
    return omni_thinker_inputs(request, DEFAULT_VOICE)


# --- thinker -> talker -----------------------------------------------------------------------


def talker_inputs(request: Any, upstream: dict) -> dict:
    """The thinker's finished output -> talker inputs (see `talker.Qwen3OmniTalker.build_prompt`).

    The thinker returns one hidden state and one input embedding per fed position: the L
    prompt positions, then one per generated token but the last (never fed back).
    """
    out = upstream[THINKER]
    hidden, embeds = out.hidden_states, out.extras.get("input_embeds")
    import torch

    sequence = torch.cat([_prompt_ids(out).cpu(), torch.tensor(out.token_ids, dtype=torch.long)])
    return _talker_prompt(out, hidden, embeds, sequence)


def thinker_chunks(request: Any, payload: Any, finished: bool) -> dict | None:
    """One thinker output -> the talker's input so far: its streamed start, or the next rows.

    The thinker's first output carries the L prompt rows: they start the talker's request
    (`talker_inputs` of the prompt alone, `"streamed": True`), which still lacks the first
    reply row. Each later output carries one reply row (the token it fed), sent as
    `{"reply_rows", "final"}`. So the talker gets the rows `talker_inputs` builds from the whole
    output, in the same order. A thinker that stops at its first token gets the whole hand-off.
    """
    if payload is None:
        return None
    hidden, embeds = payload.extras.get("delta_hidden_states"), payload.extras.get("delta_input_embeds")
    if hidden is None or embeds is None:
        raise ValueError("the thinker output has no hidden states / input embeddings for the talker")
    if len(payload.token_ids) == len(payload.delta_token_ids):  # the first output: the prompt rows
        if finished:
            return talker_inputs(request, {THINKER: payload})
        return {**_talker_prompt(payload, hidden, embeds, _prompt_ids(payload)), "streamed": True}
    return {"reply_rows": embeds, "final": finished}


def _prompt_ids(out: Any) -> Any:
    if "tts_embeds" not in out.extras:
        raise ValueError("the thinker output has no hidden states / input embeddings for the talker")
    return out.extras["prompt_token_ids"]


def _talker_prompt(out: Any, hidden: Any, embeds: Any, token_ids: Any) -> dict:
    if hidden is None or embeds is None:
        raise ValueError("the thinker output has no hidden states / input embeddings for the talker")
    extras = out.extras
    return {"thinker_hidden": hidden, "thinker_embeds": embeds, "token_ids": token_ids,
            "num_prompt": int(extras["prompt_token_ids"].shape[0]), "audio_seqlens": extras["audio_seqlens"],
            "image_grid_thw": extras["image_grid_thw"], "video_grid_thw": extras["video_grid_thw"],
            "video_second_per_grid": extras["video_second_per_grid"], "tts_embeds": extras["tts_embeds"],
            "voice": extras["voice"]}


# --- talker -> code2wav -----------------------------------------------------------------------

talker_chunks = FrameChunks(CODE2WAV, Code2WavParams())
"""The talker's frames so far -> the next part of the request's code2wav stream."""
