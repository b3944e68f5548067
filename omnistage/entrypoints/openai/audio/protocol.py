"""The speech request (OpenAI's fields, plus vLLM-Omni's `stream`, `max_new_tokens`, inline
`ref_audio`/`ref_text`, `seed` and the model's extras), its batch, voices, the streaming
session's messages, and the audio generation request."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from omnistage.entrypoints.openai.common import DiffusionFields
from omnistage.entrypoints.openai.errors import bad_request

SpeechFormat = Literal["wav", "pcm", "flac", "mp3", "opus", "aac"]


STREAMABLE_FORMATS = ("pcm", "wav")
"""The formats our encoders write chunk by chunk (WAV with an open-ended header)."""


class SpeechRequest(BaseModel):
    """Fields no route field names are the model's declared extras (Qwen3-TTS: `language`,
    `non_streaming_mode`), checked against them by the serving; unknown ones are a 400.
    vLLM-Omni's `extra_params` object carries the same extras."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str = Field(min_length=1, max_length=4096)
    voice: str | None = Field(default=None, json_schema_extra={"anyOf": [
        {"type": "string"}, {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"],
                             "additionalProperties": False}, {"type": "null"}]})
    """A voice the model knows, by name or as OpenAI's custom voice object `{"id": name}`; None =
    the model's default voice."""
    instructions: str | None = Field(default=None, max_length=4096)
    response_format: SpeechFormat = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    stream: bool = False
    """vLLM-Omni's: the audio must go out as the model makes it (pcm or wav, speed 1; else a 400)."""
    max_new_tokens: int | None = Field(default=None, ge=1)
    """vLLM-Omni's: the most codec frames the talker samples (default: the deploy's max_tokens)."""
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
    extra_params: dict[str, Any] | None = None
    """vLLM-Omni's: the model's extras as one object, beside sending them as fields (both with
    different values is a 400 naming the field)."""
    word_timestamps: bool = False
    """vLLM-Omni's: word times from a forced aligner. No served speech family produces alignments,
    so true is a 400 naming it."""

    @field_validator("voice", mode="before")
    @classmethod
    def _voice_by_id(cls, voice: Any) -> Any:
        """OpenAI's custom voice reference (`{"id": "my-voice"}`, as its client sends one) names the voice."""
        if isinstance(voice, dict):
            if set(voice) != {"id"}:
                raise ValueError('a voice name, or {"id": name}')
            return voice["id"]
        return voice


# --- POST /v1/audio/speech/batch ------------------------------------------------------------

MAX_BATCH_ITEMS = 32
"""Most inputs one POST /v1/audio/speech/batch may carry (vLLM-Omni's limit)."""


class SpeechBatchRequest(BaseModel):
    """vLLM-Omni's batch: `items` are speech requests (each at least `input`); every other field
    is a default the items share (an item's own value wins). Items are checked one by one, so a
    bad item fails alone."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_BATCH_ITEMS)
    response_format: SpeechFormat = "wav"


class SpeechBatchResult(BaseModel):
    index: int
    status: Literal["success", "error"]
    audio_data: str | None = None
    """The encoded audio, base64."""
    media_type: str | None = None
    sample_rate: int | None = None
    usage: dict[str, Any] | None = None
    """As `speech.audio.done`'s: tokens in and out, characters, seconds of audio."""
    error: dict[str, Any] | None = None
    """OpenAI's error object (message, type, param, code); `param` is located in the batch body
    (`items[2].voice`)."""


class SpeechBatchResponse(BaseModel):
    id: str
    results: list[SpeechBatchResult]
    total: int
    succeeded: int
    failed: int


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
    word_timestamps: bool = False
    """vLLM-Omni's: no served family produces word alignments, so true is an error naming it."""


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
    prompt: str | None = Field(default=None, min_length=1, max_length=32000)
    input: str | None = Field(default=None, min_length=1, max_length=32000)
    """vLLM-Omni's name for `prompt`."""
    duration_seconds: float | None = Field(default=None, gt=0, le=3600)
    """Seconds of audio; None = the model's whole window (Stable Audio Open: 47.55 s)."""
    audio_length: float | None = Field(default=None, gt=0, le=3600)
    """vLLM-Omni's name for `duration_seconds`."""
    response_format: SpeechFormat = "wav"

    def text(self) -> str:
        text = _one_of(self, "prompt", "input")
        if text is None:
            raise bad_request("prompt: the description of the audio is required (or vLLM-Omni's input)",
                              param="prompt")
        return text

    def seconds(self) -> float | None:
        return _one_of(self, "duration_seconds", "audio_length")


def _one_of(body: BaseModel, ours: str, theirs: str) -> Any:
    """The value of a field sent under our name or vLLM-Omni's; both and different is a 400."""
    mine, other = getattr(body, ours), getattr(body, theirs)
    if mine is not None and other is not None and mine != other:
        raise bad_request(f"{theirs}: vLLM-Omni's name for {ours}, which says otherwise ({other!r} vs {mine!r}); "
                          f"send one", param=theirs)
    return mine if mine is not None else other


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
