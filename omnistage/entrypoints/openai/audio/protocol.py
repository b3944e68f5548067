"""The speech request (OpenAI's fields, plus vLLM-Omni's inline `ref_audio`/`ref_text` and `seed`),
voices, the streaming session's messages, and the audio generation request."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from omnistage.entrypoints.openai.common import DiffusionFields

SpeechFormat = Literal["wav", "pcm", "flac", "mp3", "opus", "aac"]


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str = Field(min_length=1, max_length=4096)
    voice: str | None = None
    """A voice the model knows; None = the model's default voice."""
    instructions: str | None = Field(default=None, max_length=4096)
    response_format: SpeechFormat = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    ref_audio: str | None = Field(default=None, max_length=64 * 1024 * 1024)
    """A reference clip to clone the voice from (base64 or a data URL), as vLLM-Omni's speech route
    takes it; models that clone voices only. Overrides `voice` (which the official client always sends)."""
    ref_text: str | None = None
    """What `ref_audio` says (improves cloning)."""
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    """Seeds the talker's sampling: the same seed and input give the same audio."""
    task_type: str | None = Field(default=None, max_length=64)
    """vLLM-Omni's TTS task (Qwen3-TTS: CustomVoice, VoiceDesign, Base); it must be the checkpoint's.
    Sent to the model as given; models without tasks refuse it by name."""


# --- voices ------------------------------------------------------------------------------


class VoiceInfo(BaseModel):
    name: str
    type: Literal["builtin", "cloned"]
    sample_rate: int | None = None
    duration_s: float | None = None
    ref_text: str | None = None
    created_at: int | None = None


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VoiceInfo]


# --- WS /v1/audio/speech/stream: what the client sends -----------------------------------


class SessionConfig(BaseModel):
    """Sticky settings of a streaming session; send it before the first text."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["session.config"]
    model: str | None = None
    voice: str | None = None
    instructions: str | None = Field(default=None, max_length=4096)
    response_format: Literal["pcm", "wav"] = "pcm"
    """Binary frames carry PCM16; "wav" puts a streaming WAV header before each sentence's first frame."""
    speed: float = Field(default=1.0, ge=0.25, le=4.0)


class InputText(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["input.text"]
    text: str = Field(max_length=4096)


class InputDone(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["input.done"]


ClientMessage = Annotated[SessionConfig | InputText | InputDone, Field(discriminator="type")]


# --- POST /v1/audio/generate: text -> sound or music (diffusion audio models) ---------------


class AudioGenerateRequest(DiffusionFields):
    """vLLM-Omni's audio generation fields; other fields are the model's declared extras
    (Stable Audio: `audio_start_in_s`), checked by the engine."""

    model: str | None = None
    prompt: str = Field(min_length=1, max_length=32000)
    duration_seconds: float | None = Field(default=None, gt=0, le=3600)
    """Seconds of audio; None = the model's whole window (Stable Audio Open: 47.55 s)."""
    response_format: SpeechFormat = "wav"


# --- transcriptions ------------------------------------------------------------------------

TranscriptionFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]


class TranscriptionRequest(BaseModel):
    """The text fields of POST /v1/audio/transcriptions (the audio is the `file` upload)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    language: str | None = Field(default=None, min_length=2, max_length=16)
    """The spoken language (ISO-639-1, e.g. "en"): the model is asked for text in it."""
    prompt: str | None = Field(default=None, max_length=4096)
    """Text the audio follows on from (names, spellings), given to the model as context."""
    response_format: TranscriptionFormat = "json"
    temperature: float = Field(default=0.0, ge=0.0, le=1.0)
    stream: bool = False
    timestamp_granularities: Literal["segment"] | None = None
    """Only "segment": the omni thinkers give no word times (their one segment is the clip); refused
    by a speech recognition family that gives no times (Qwen3-ASR)."""


class TranslationRequest(BaseModel):
    """The text fields of POST /v1/audio/translations: speech in any language -> English text."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = Field(default=None, max_length=4096)
    """English text the audio follows on from, given to the model as context."""
    response_format: TranscriptionFormat = "json"
    temperature: float = Field(default=0.0, ge=0.0, le=1.0)
