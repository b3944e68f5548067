"""Voices: the model's built-in ones, and reference clips registered for voice cloning.

    POST   /v1/audio/voices          multipart: name, audio_sample (file), optional ref_text
    GET    /v1/audio/voices          built-in and registered voices
    DELETE /v1/audio/voices/{name}   forget a registered voice

A model says what it takes in its `PipelineSpec.request_extras`: "voice" with `choices`
(the built-in names), and "ref_audio" when it clones voices. A registered voice is
decoded once (soundfile, mixed to mono; any rate) and kept in this server's memory; a
speech request naming it sends the clip in the prompt as `ref_audio` (float32 mono),
`ref_sample_rate` and `ref_text`, and the model resamples it to its own rate. Voices
belong to one server (`app.state.voice_store`) and are lost when it stops.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnistage.entrypoints.openai.audio.protocol import VoiceInfo, VoiceList
from omnistage.entrypoints.openai.common import read_form, read_upload
from omnistage.entrypoints.openai.errors import APIError, bad_request
from omnistage.media.audio import decode_audio
from omnistage.media.image import decode_base64_payload

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_VOICES = 64
MIN_SECONDS, MAX_SECONDS = 0.1, 60.0
MAX_REF_TEXT = 4096


@dataclass
class Voice:
    name: str
    audio: np.ndarray
    """float32 mono at `sample_rate`."""
    sample_rate: int
    ref_text: str = ""
    created_at: int = field(default_factory=lambda: int(time.time()))

    def info(self) -> VoiceInfo:
        return VoiceInfo(name=self.name, type="cloned", sample_rate=self.sample_rate,
                         duration_s=round(len(self.audio) / self.sample_rate, 3), ref_text=self.ref_text,
                         created_at=self.created_at)


class VoiceStore:
    def __init__(self, builtin: tuple[str, ...] | None, can_clone: bool, max_voices: int = MAX_VOICES):
        self.builtin = builtin
        """The model's built-in voice names; None when it declares none (any name goes to the model)."""
        self.can_clone = can_clone
        self.max_voices = max_voices
        self._voices: dict[str, Voice] = {}

    @classmethod
    def from_spec(cls, spec: Any) -> VoiceStore:
        extras = getattr(spec, "request_extras", None) or {}
        voice = extras.get("voice")
        builtin = tuple(voice.choices) if voice is not None and voice.choices else None
        return cls(builtin, "ref_audio" in extras)

    # --- the routes ----------------------------------------------------------------------

    async def register(self, request: Any) -> VoiceInfo:
        form = await read_form(request, allow_urlencoded=False, file_fields=("audio_sample",))
        unknown = sorted(set(form.fields) - {"name", "ref_text"})
        if unknown:
            raise bad_request(f"unknown field {unknown[0]!r}; fields: name, audio_sample, ref_text",
                              param=unknown[0], code="unknown_field")
        if not self.can_clone:
            raise bad_request("this model does not clone voices; use one of its built-in voices",
                              code="unsupported_route")
        name = form.fields.get("name", "")
        self._check_name(name)
        ref_text = form.fields.get("ref_text", "")
        if len(ref_text) > MAX_REF_TEXT:
            raise bad_request(f"ref_text: at most {MAX_REF_TEXT} characters, got {len(ref_text)}", param="ref_text")
        files = form.files.get("audio_sample") or []
        if len(files) != 1:
            raise bad_request("audio_sample: upload exactly one audio file", param="audio_sample")
        data = await read_upload(files[0], "audio_sample")
        audio, rate = reference_clip(data, "audio_sample")
        self._check_name(name)  # another request may have taken it while the upload was read
        voice = Voice(name, np.ascontiguousarray(audio, dtype=np.float32), int(rate), ref_text)
        self._voices[name] = voice
        return voice.info()

    def list(self) -> VoiceList:
        data = [VoiceInfo(name=name, type="builtin") for name in self.builtin or ()]
        return VoiceList(data=data + [v.info() for v in self._voices.values()])

    def delete(self, name: str) -> dict:
        if name in (self.builtin or ()):
            raise bad_request(f"name: {name!r} is a built-in voice; only registered voices can be deleted",
                              param="name")
        if self._voices.pop(name, None) is None:
            raise APIError(404, f"no registered voice {name!r}", param="name", code="voice_not_found")
        return {"name": name, "object": "voice", "deleted": True}

    def _check_name(self, name: str) -> None:
        if not NAME.match(name):
            raise bad_request("name: 1 to 64 letters, digits, '_', '-' or '.', starting with a letter or digit; "
                              f"got {name!r}", param="name")
        if name in (self.builtin or ()):
            raise bad_request(f"name: {name!r} is a built-in voice", param="name")
        if name in self._voices:
            raise APIError(409, f"a voice named {name!r} exists; delete it first", param="name",
                           code="voice_exists")
        if len(self._voices) >= self.max_voices:
            raise bad_request(f"this server holds {self.max_voices} voices, its limit; delete one first",
                              code="too_many_voices")

    # --- speech requests ---------------------------------------------------------------

    def inline_clone_fields(self, ref_audio: str, ref_text: str | None) -> dict[str, Any]:
        """A speech request's own reference clip (base64 or a data URL) as engine prompt fields."""
        if not self.can_clone:
            raise bad_request("ref_audio: this model does not clone voices; use one of its built-in voices",
                              param="ref_audio")
        if ref_text is not None and len(ref_text) > MAX_REF_TEXT:
            raise bad_request(f"ref_text: at most {MAX_REF_TEXT} characters, got {len(ref_text)}", param="ref_text")
        try:
            data = decode_base64_payload(ref_audio, "ref_audio")
        except ValueError as e:
            raise bad_request(str(e), param="ref_audio", code="invalid_audio") from None
        audio, rate = reference_clip(data, "ref_audio")
        return {"ref_audio": audio, "ref_sample_rate": rate, "ref_text": ref_text or ""}

    def prompt_fields(self, voice: str | None) -> dict[str, Any]:
        """What a speech request's `voice` adds to the engine prompt (400 for a name nobody knows)."""
        if voice is None:
            return {}
        registered = self._voices.get(voice)
        if registered is not None:
            return {"ref_audio": registered.audio, "ref_sample_rate": registered.sample_rate,
                    "ref_text": registered.ref_text}
        if self.builtin is not None and voice not in self.builtin:
            known = ", ".join([*self.builtin, *self._voices]) or "none"
            raise bad_request(f"voice: unknown voice {voice!r}; voices: {known}", param="voice",
                              code="voice_not_found")
        return {"voice": voice}


def reference_clip(data: bytes, param: str) -> tuple[np.ndarray, int]:
    """Decoded reference audio, within the clip length limits (400 naming `param` otherwise)."""
    try:
        audio, rate = decode_audio(data, field=param)
    except ValueError as e:
        raise bad_request(str(e), param=param, code="invalid_audio") from None
    seconds = len(audio) / rate
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise bad_request(f"{param}: {seconds:.2f} s of audio; a reference clip must last "
                          f"{MIN_SECONDS} to {MAX_SECONDS:.0f} s", param=param, code="invalid_audio")
    if not np.isfinite(audio).all():
        raise bad_request(f"{param}: the audio has NaN or infinite samples", param=param, code="invalid_audio")
    return np.ascontiguousarray(audio, dtype=np.float32), int(rate)
