"""Completions request and response bodies (OpenAI's legacy completions API), with vLLM's
sampling extensions at the top level (`top_k`, `min_p`, `structured_outputs`, ...)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from omnistage.core.lora import LoraRequest
from omnistage.entrypoints.openai.chat.protocol import StreamOptions, Usage


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # vLLM's extra sampling fields; unknown ones are a 400 later

    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    """One prompt (text or token ids) or a list of them; each gets `n` choices."""
    suffix: str | None = None
    """Not supported (no fill-in-the-middle): given, it is a 400 naming it."""
    max_tokens: int | None = Field(default=16, ge=1)
    """OpenAI's default is 16; null = until the model stops (capped at max_model_len)."""
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1)
    best_of: int | None = Field(default=None, ge=1)
    """Sample this many per prompt and return the `n` with the highest total logprob (not with stream)."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    """Prepend the prompt text to each choice's text (text prompts only)."""
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    frequency_penalty: Literal[0, 0.0] | None = None
    """Accepted only as 0: the engine has no frequency penalty (use repetition_penalty)."""
    presence_penalty: Literal[0, 0.0] | None = None
    """Accepted only as 0: the engine has no presence penalty (use repetition_penalty)."""
    logit_bias: None = None
    user: str | None = None
    lora: LoraRequest | None = None
    """A LoRA adapter of the text stage by name ({"name": ..., "scale": ...}), or a peft folder loaded on
    first use ({"name": ..., "path": ...}, deploy `max_loras`)."""

    def extras(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
