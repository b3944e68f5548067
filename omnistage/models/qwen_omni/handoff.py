"""The hand-off pieces both Qwen omni families run alike (in the orchestrator, not the engines).

    request ──thinker_inputs──> thinker ──thinker_chunks──> talker ──talker_chunks──> vocoder

- `omni_thinker_inputs`: the prompt as the AR engine takes it, plus the voice and the
  request for every position's hidden state and input embedding (what the talker reads),
  unless the request's `output_modalities` leave out audio (then no talker runs);
- `thinker_only_inputs`: the same without them (the thinker-only variant);
- `talker_stream_inputs`: a streamed thinker chunk passed on as the talker's input;
- `check_voice`: the thinker and the talker refuse a voice the checkpoint lacks.

What the talker reads of the thinker's rows differs per family (its `talker_inputs` and
`thinker_chunks`). Stateless, torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

THINKER, TALKER, VOCODER = 0, 1, 2
"""Both families' stage ids."""

# --- thinker inputs -------------------------------------------------------------------------


def omni_thinker_inputs(request: Any, default_voice: str) -> dict:
    """Prompt -> an omni thinker's inputs, asking for what the talker needs; a request that
    wants no audio runs no talker, so it asks for nothing more than the thinker-only variant.
    The families differ only in their default voice."""
    if request.output_modalities is not None and "audio" not in request.output_modalities:
        return thinker_only_inputs(request, {})
    inputs = _prompt_dict(request.prompt)
    inputs["voice"] = inputs.get("voice") or default_voice
    inputs["return_hidden_states"] = True
    inputs["return_input_embeds"] = True
    return inputs


def thinker_only_inputs(request: Any, upstream: dict) -> dict:
    """Prompt -> thinker inputs when no audio is made (a voice in the prompt is not used)."""
    inputs = _prompt_dict(request.prompt)
    inputs.pop("voice", None)
    return inputs


def _prompt_dict(prompt: Any) -> dict:
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if isinstance(prompt, dict):
        return dict(prompt)
    raise TypeError(f"omni prompts are a str or a dict ({{'messages': [...], 'voice': ...}}), "
                    f"got {type(prompt).__name__}")


def talker_stream_inputs(request: Any, upstream: dict) -> dict:
    """A streamed thinker chunk is already the talker's input (see the family's `thinker_chunks`)."""
    return upstream[THINKER]


def check_voice(speakers: Mapping[str, Any], voice: str, any_case: bool = False) -> None:
    """A voice the checkpoint has (Qwen3-Omni's names are lower case and match in any case)."""
    if (voice.lower() if any_case else voice) not in speakers:
        raise ValueError(f"unknown voice {voice!r}; this checkpoint has {sorted(speakers)}")
