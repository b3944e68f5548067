"""How a transcription request asks Qwen3-ASR, and how its answer reads.

As `Qwen3ASRProcessor.apply_transcription_request` builds it: the context (`prompt`) is the
system turn, the audio the user turn, and a language, when given, is forced by starting the
assistant turn with "language <Name><asr_text>" (the model then writes only the transcript).
Without one the model writes "language <Name><asr_text>" itself, then the transcript.

Torch-free: the server process calls these.
"""

from __future__ import annotations

from typing import Any

from omnistage.core.errors import RequestError

MARKER = "<asr_text>"
TAG = "language "
# {ISO code: the name the model was trained with}: `processing_qwen3_asr.LANGUAGE_CODE_TO_NAME`
# of transformers, restated because importing that module costs seconds in the server process
# (tests/models/test_qwen3_asr.py checks the two agree).
LANGUAGES = {
    "ar": "Arabic", "yue": "Cantonese", "zh": "Chinese", "cs": "Czech", "da": "Danish", "nl": "Dutch",
    "en": "English", "fil": "Filipino", "fi": "Finnish", "fr": "French", "de": "German", "el": "Greek",
    "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean",
    "mk": "Macedonian", "ms": "Malay", "fa": "Persian", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
    "ru": "Russian", "es": "Spanish", "sv": "Swedish", "th": "Thai", "tr": "Turkish", "vi": "Vietnamese",
}
_BY_NAME = {name.lower(): name for name in LANGUAGES.values()}


def language_name(language: str) -> str:
    """An ISO-639-1 code ("en") or a name ("English"), any case -> the model's name for it."""
    name = LANGUAGES.get(language.lower()) or _BY_NAME.get(language.lower())
    if name is None:
        raise RequestError("language", f"Qwen3-ASR does not know the language {language!r}; it knows "
                                       f"{', '.join(sorted(LANGUAGES))} (or their names, e.g. 'English')")
    return name


def transcription_prompt(audio: Any, sample_rate: int, language: str | None = None,
                         context: str | None = None) -> dict:
    """The chat messages the AR stage takes (see `model.Qwen3ASR.build_prompt`)."""
    messages = []
    if context:
        messages.append({"role": "system", "content": [{"type": "text", "text": context}]})
    messages.append({"role": "user", "content": [{"type": "audio", "audio": audio, "sample_rate": sample_rate}]})
    if language:
        messages.append({"role": "assistant", "content": [{"type": "text",
                                                           "text": f"{TAG}{language_name(language)}{MARKER}"}]})
    return {"messages": messages}


def parse_transcript(text: str, language: str | None = None, final: bool = True) -> tuple[str | None, str]:
    """(language, transcript) of the text generated so far, as the processor's `parse_output` reads
    a finished one (without its repetition clean-up). A forced `language` leaves the text all
    transcript. While the model is still writing its "language <Name>" tag, the transcript is ""."""
    if language:
        return language_name(language), text.strip()
    if MARKER not in text:
        head = text.lstrip()
        if not final and (head.startswith(TAG) or TAG.startswith(head)):
            return None, ""  # the tag is not finished: nothing of the transcript yet
        return None, text.strip()
    tag, transcript = text.split(MARKER, 1)
    tag = tag.strip()
    name = tag[len(TAG):].strip() if tag.lower().startswith(TAG) else tag.splitlines()[0].strip() if tag else ""
    return (None if name.lower() in ("", "none") else name), transcript.strip()
