"""LoRA adapter bodies."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """The name requests give in `lora: {"name": ...}`."""
    path: str = Field(min_length=1)
    """A LoRA file on the server in diffusers' safetensors format (a diffusion stage), or a peft adapter
    folder (a native AR stage)."""


class LoraAdapter(BaseModel):
    name: str
    path: str
    loaded: bool
    """Held by the stage now; one loaded by path and unloaded to make room loads again on its next use."""
    source: Literal["deploy", "path"]
    """"deploy": the deploy config's `lora_adapters`, loaded for good; "path": loaded by path (`max_loras`)."""
    stage: str
    """The stage that serves it."""


class LoraAdapterList(BaseModel):
    object: Literal["list"] = "list"
    data: list[LoraAdapter]
