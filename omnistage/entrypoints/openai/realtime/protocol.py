"""Client events of the Realtime protocol (GA names) and the session's settings.

Fields the server does not implement are refused by name (`extra="forbid"`), never
dropped: a client that asks for tools or noise reduction learns it at once. The
beta protocol's flat session fields (`voice`, `input_audio_format`, `turn_detection`,
`modalities`, ...) are read as their GA places (`SessionSettings.update`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from omnistage.entrypoints.openai.realtime.audio_format import BETA_NAMES, RATES

FormatName = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
BetaFormatName = Literal["pcm16", "g711_ulaw", "g711_alaw"]
Modality = Literal["text", "audio"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AudioFormat(_Strict):
    type: FormatName
    rate: Literal[24000] | None = None
    """Only audio/pcm has a rate, and OpenAI's is 24 kHz."""


class TurnDetection(_Strict):
    type: Literal["server_vad"]
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=10_000)
    silence_duration_ms: int = Field(500, ge=0, le=10_000)
    create_response: bool = True
    """Commit and answer when speech stops."""
    interrupt_response: bool = True
    """Speech that starts while a response runs cancels it (barge-in)."""
    idle_timeout_ms: None = None


class Transcription(_Strict):
    """Transcribe each committed user turn (by the served model's thinker, as
    POST /v1/audio/transcriptions does)."""

    model: str | None = None
    language: str | None = Field(None, min_length=2, max_length=16)
    prompt: str | None = Field(None, max_length=4096)


class InputAudio(_Strict):
    format: AudioFormat | None = None
    turn_detection: TurnDetection | None = None
    transcription: Transcription | None = None
    noise_reduction: None = None


class OutputAudio(_Strict):
    format: AudioFormat | None = None
    voice: str | None = None
    speed: Literal[1.0] | None = None


class AudioConfig(_Strict):
    input: InputAudio | None = None
    output: OutputAudio | None = None


class SessionConfig(_Strict):
    """`session` of session.update: GA fields, then the beta names still in use."""

    type: Literal["realtime"] | None = None
    model: str | None = None
    instructions: str | None = None
    output_modalities: list[Modality] | None = Field(None, min_length=1)
    audio: AudioConfig | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    tools: list[Annotated[dict, Field(max_length=0)]] | None = Field(None, max_length=0)
    tool_choice: Literal["auto", "none"] | None = None
    tracing: None = None
    # beta
    modalities: list[Modality] | None = Field(None, min_length=1)
    voice: str | None = None
    input_audio_format: BetaFormatName | None = None
    output_audio_format: BetaFormatName | None = None
    turn_detection: TurnDetection | None = None
    input_audio_transcription: Transcription | None = None


class ResponseConfig(_Strict):
    """`response` of response.create: overrides for this response only."""

    instructions: str | None = None
    output_modalities: list[Modality] | None = Field(None, min_length=1)
    modalities: list[Modality] | None = Field(None, min_length=1)
    audio: AudioConfig | None = None
    voice: str | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    metadata: dict[str, str] | None = None


class InputContent(_Strict):
    type: Literal["input_text", "input_audio", "text"]
    text: str | None = None
    audio: str | None = None
    """base64 in the session's input format."""
    transcript: str | None = None


class MessageItem(_Strict):
    id: str | None = Field(None, max_length=64)
    type: Literal["message"] = "message"
    object: Literal["realtime.item"] | None = None
    # The Responses items' order: typing caches equal Literals, so another order here reordered their schema.
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    role: Literal["user", "system", "assistant"]
    content: list[InputContent] = Field(min_length=1)


class _Event(_Strict):
    event_id: str | None = None


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionConfig


class BufferAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str


class BufferCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class BufferClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ItemCreate(_Event):
    type: Literal["conversation.item.create"]
    previous_item_id: str | None = None
    item: MessageItem


class ItemDelete(_Event):
    type: Literal["conversation.item.delete"]
    item_id: str


class ItemRetrieve(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ItemTruncate(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = Field(ge=0)
    audio_end_ms: int = Field(ge=0)


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: ResponseConfig | None = None


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: str | None = None


ClientEvent = Union[SessionUpdate, BufferAppend, BufferCommit, BufferClear, ItemCreate, ItemDelete, ItemRetrieve,
                    ItemTruncate, ResponseCreate, ResponseCancel]
EVENTS: dict[str, type[_Event]] = {e.model_fields["type"].annotation.__args__[0]: e for e in ClientEvent.__args__}


# --- a full-duplex session's client events (duplex.py): no commits, no turns ---------------------


class DuplexSessionConfig(_Strict):
    """A duplex session's settings are the model's (it hears and speaks 16-bit PCM at its rate):
    only the model may be named."""

    type: Literal["realtime"] | None = None
    model: str | None = None


class DuplexSessionUpdate(_Event):
    type: Literal["session.update", "session.create"]
    session: DuplexSessionConfig | None = None


class SessionClose(_Event):
    type: Literal["session.close"]


DUPLEX_EVENTS: dict[str, type[_Event]] = {"input_audio_buffer.append": BufferAppend,
                                          "session.update": DuplexSessionUpdate,
                                          "session.create": DuplexSessionUpdate, "session.close": SessionClose}


@dataclass(frozen=True)
class SessionSettings:
    """The session as it stands after every session.update (what session.updated shows)."""

    model: str
    voice: str | None = None
    instructions: str = ""
    output_modalities: tuple[str, ...] = ("audio",)
    input_format: str = "audio/pcm"
    output_format: str = "audio/pcm"
    turn_detection: TurnDetection | None = field(default_factory=lambda: TurnDetection(type="server_vad"))
    max_output_tokens: int | None = None
    temperature: float | None = None
    transcription: Transcription | None = None

    def update(self, s: SessionConfig | ResponseConfig) -> SessionSettings:
        """These settings with the given fields of `s` over them (GA places first)."""
        given = s.model_fields_set
        changes: dict[str, Any] = {}
        if s.instructions is not None:
            changes["instructions"] = s.instructions
        modalities = s.output_modalities or s.modalities
        if modalities:
            changes["output_modalities"] = tuple(dict.fromkeys(modalities))
        if "max_output_tokens" in given:
            changes["max_output_tokens"] = None if s.max_output_tokens in (None, "inf") else s.max_output_tokens
        if s.temperature is not None:
            changes["temperature"] = s.temperature
        if s.voice is not None:
            changes["voice"] = s.voice
        if isinstance(s, SessionConfig):
            if s.input_audio_format is not None:
                changes["input_format"] = BETA_NAMES[s.input_audio_format]
            if s.output_audio_format is not None:
                changes["output_format"] = BETA_NAMES[s.output_audio_format]
            if "turn_detection" in given:
                changes["turn_detection"] = s.turn_detection
            if "input_audio_transcription" in given:
                changes["transcription"] = s.input_audio_transcription
        audio = s.audio
        if audio is not None and audio.input is not None and isinstance(s, SessionConfig):
            if audio.input.format is not None:
                changes["input_format"] = audio.input.format.type
            if "turn_detection" in audio.input.model_fields_set:
                changes["turn_detection"] = audio.input.turn_detection
            if "transcription" in audio.input.model_fields_set:
                changes["transcription"] = audio.input.transcription
        if audio is not None and audio.output is not None:
            if audio.output.format is not None:
                changes["output_format"] = audio.output.format.type
            if audio.output.voice is not None:
                changes["voice"] = audio.output.voice
        return replace(self, **changes)

    def as_openai(self) -> dict[str, Any]:
        """The GA `session` object."""
        def fmt(name: str) -> dict[str, Any]:
            return {"type": name, "rate": RATES[name]} if name == "audio/pcm" else {"type": name}

        return {
            "type": "realtime", "object": "realtime.session", "model": self.model,
            "output_modalities": list(self.output_modalities), "instructions": self.instructions,
            "audio": {
                "input": {"format": fmt(self.input_format), "noise_reduction": None,
                          "transcription": self.transcription.model_dump() if self.transcription else None,
                          "turn_detection": self.turn_detection.model_dump() if self.turn_detection else None},
                "output": {"format": fmt(self.output_format), "voice": self.voice, "speed": 1.0},
            },
            "tools": [], "tool_choice": "auto", "tracing": None,
            "max_output_tokens": "inf" if self.max_output_tokens is None else self.max_output_tokens,
        }
