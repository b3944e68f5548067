"""What a Qwen3-TTS request says, checked against the checkpoint (torch-free).

A checkpoint is of one task, its config's `tts_model_type`, named in requests by the
reference server's `task_type`:

    CustomVoice  (custom_voice)  a built-in speaker (`voice`, a name of talker_config.spk_id,
                                 any case; default the first), optional `instructions` (style;
                                 not on the 0.6B models, as the authors' wrapper)
    VoiceDesign  (voice_design)  the voice described by `instructions`; `voice` is ignored
    Base         (base)          a voice cloned from `ref_audio` (mono float, with `ref_sample_rate`):
                                 with `ref_text` (its transcript) the clip's codes and text are
                                 in the prompt (the authors' in-context mode), without it only its
                                 speaker embedding (their x-vector-only mode); `voice` is ignored

Prompts are a str (the text) or a dict with `PROMPT_KEYS`. `language` is "auto" (default)
or one of the checkpoint's `codec_language_id` names; `non_streaming_mode` is the authors'
flag (the whole text in the prefill; default True for CustomVoice and VoiceDesign, False
for Base, as their wrappers) — False feeds the text one token per frame. Every problem is a RequestError
naming the key (HTTP 400).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnistage.core.errors import RequestError
from omnistage.models.talker_codec.reference_clip import reference_clip
from omnistage.models.talker_codec.request import speech_request, text_to_speak

PROMPT_KEYS = ("prompt", "voice", "instructions", "language", "task_type", "non_streaming_mode", "ref_audio",
               "ref_sample_rate", "ref_text")
TASK_TYPES = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "base": "Base"}


@dataclass
class TtsPrompt:
    text: str
    speaker: str | None
    """Lower-case speaker name (CustomVoice), or None."""
    instructions: str | None
    language_id: int | None
    """The codec language id, or None for "auto"."""
    non_streaming: bool
    ref_audio: np.ndarray | None = None
    """Base: the float32 mono reference clip at `ref_sample_rate`."""
    ref_sample_rate: int | None = None
    ref_text: str | None = None
    """Base: the clip's transcript (in-context cloning), or None (speaker embedding only)."""


def task_type(config: Mapping[str, Any]) -> str:
    kind = config.get("tts_model_type")
    if kind not in TASK_TYPES:
        raise ValueError(f"Qwen3-TTS checkpoint: unknown tts_model_type {kind!r}; expected one of {list(TASK_TYPES)}")
    return TASK_TYPES[kind]


def speakers(config: Mapping[str, Any]) -> list[str]:
    """The checkpoint's built-in speakers, lower case, in config order."""
    return [name.lower() for name in (config["talker_config"].get("spk_id") or {})]


def parse_prompt(inputs: Any, config: Mapping[str, Any]) -> TtsPrompt:
    inputs = speech_request(inputs, "Qwen3-TTS", PROMPT_KEYS)
    text = text_to_speak(inputs)
    task = task_type(config)
    asked = inputs.get("task_type")
    if asked is not None and asked != task:
        raise RequestError("task_type", f"task_type: this checkpoint does {task}, not {asked!r}")
    talker = config["talker_config"]
    ref = _reference(inputs, task)
    instructions = inputs.get("instructions") or None
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("instructions", f"instructions: expected a string, got {type(instructions).__name__}")
    voice = inputs.get("voice")
    known = speakers(config)
    if task == "CustomVoice":
        voice = known[0] if voice is None else voice
        if not isinstance(voice, str) or voice.lower() not in known:
            raise RequestError("voice", f"voice: unknown voice {voice!r}; this checkpoint's voices: {', '.join(known)}")
        voice = voice.lower()
        if instructions is not None and config.get("tts_model_size") == "0b6":
            raise RequestError("instructions", "instructions: the 0.6B CustomVoice models do not follow instructions")
    else:
        voice = None  # no built-in voices (OpenAI clients always send a voice)
        if task == "Base" and instructions is not None:
            raise RequestError("instructions", "instructions: a Base checkpoint clones the voice of ref_audio; it takes no "
                               "instructions")
    language = inputs.get("language") or "auto"
    languages = {k.lower(): v for k, v in (talker.get("codec_language_id") or {}).items()}
    if not isinstance(language, str) or (language.lower() != "auto" and
                                         (language.lower() not in languages or "dialect" in language.lower())):
        names = ["auto", *(k for k in languages if "dialect" not in k)]
        raise RequestError("language", f"language: unknown language {language!r}; expected one of {names}")
    language = language.lower()
    language_id = None if language == "auto" else int(languages[language])
    dialect = (talker.get("spk_is_dialect") or {}).get(voice) if voice is not None else None
    if dialect and language in ("chinese", "auto"):
        language_id = int(languages[dialect])  # the authors' rule: a dialect speaker speaks Chinese in dialect
    non_streaming = inputs.get("non_streaming_mode", task != "Base")
    if not isinstance(non_streaming, bool):
        raise RequestError("non_streaming_mode", f"non_streaming_mode: expected a bool, got {non_streaming!r}")
    return TtsPrompt(text, voice, instructions, language_id, non_streaming, *ref)


def _reference(inputs: Mapping[str, Any], task: str) -> tuple:
    """(ref_audio, ref_sample_rate, ref_text), checked; all None outside Base."""
    if task != "Base":
        for key in ("ref_audio", "ref_sample_rate", "ref_text"):
            if inputs.get(key) is not None:
                raise RequestError(key, f"{key}: this {task} checkpoint does not clone voices (Base checkpoints do)")
        return None, None, None
    clip = reference_clip(inputs)
    if clip is None:
        raise RequestError("ref_audio", "ref_audio: a Base checkpoint clones a voice: give ref_audio (or a registered voice)")
    return clip.audio, clip.sample_rate, clip.text or None
