"""Request and response bodies of the images routes (OpenAI's, plus diffusion extensions).

`quality` and `style` are accepted for client compatibility and ignored: a diffusion
model has no such switches (steps and guidance are the knobs). Fields no route field
names are the model's declared extras (e.g. `max_sequence_length`), checked by the engine.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from omnistage.entrypoints.openai.common import DiffusionFields

ResponseFormat = Literal["b64_json", "url"]
OutputFormat = Literal["png", "jpeg", "webp"]


class ImageRequestFields(DiffusionFields):
    model: str | None = None
    prompt: str = Field(min_length=1, max_length=32000)
    n: int = Field(default=1, ge=1)
    size: str | None = None
    """'WIDTHxHEIGHT', or 'auto'/None for the model's default (the input image's size for edits)."""
    response_format: ResponseFormat = "b64_json"
    output_format: OutputFormat = "png"
    user: str | None = None
    quality: str | None = None
    """Accepted and ignored."""
    style: str | None = None
    """Accepted and ignored."""
    stream: bool = False
    """Answer Server-Sent Events: `partial_images` previews, then one completed event per image."""
    partial_images: int = Field(default=0, ge=0, le=3)
    """Previews of the (first) image decoded at evenly spaced denoising steps, when streaming."""


class ImageGenerationRequest(ImageRequestFields):
    pass


class ImageEditRequest(ImageRequestFields):
    """The text fields of the multipart edit form (`image`, `mask` are files)."""


class ImageData(BaseModel):
    b64_json: str | None = None
    url: str | None = None
    revised_prompt: str | None = None


class ImagesResponse(BaseModel):
    created: int
    data: list[ImageData]
    output_format: OutputFormat
    size: str
