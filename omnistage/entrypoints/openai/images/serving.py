"""Images: build the diffusion request, run it, encode the answer as base64 or a URL.

With `stream: true` the answer is Server-Sent Events in OpenAI's shapes: one
`image_generation.partial_image` (edits: `image_edit.partial_image`) per preview the
engine sends (`partial_images` of them, the VAE decode of the first image's latents at
evenly spaced steps), then one `...completed` event per output image, with `usage`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from PIL import Image
from starlette.requests import Request

from omnistage.diffusion.params import DiffusionParams
from omnistage.entrypoints.openai.capabilities import Capabilities
from omnistage.entrypoints.openai.common import (
    Form,
    check_model,
    check_n,
    parse_size,
    read_upload,
    validate,
)
from omnistage.entrypoints.openai.engine_client import EngineGateway, RequestStream, new_request_id
from omnistage.entrypoints.openai.errors import APIError, bad_request, from_value_error
from omnistage.entrypoints.openai.files import FileStore
from omnistage.entrypoints.openai.images.protocol import (
    ImageData,
    ImageEditRequest,
    ImageGenerationRequest,
    ImageRequestFields,
    ImagesResponse,
)
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.media.image import encode_image

MAX_INPUT_IMAGES = 16


class ImageServing:
    def __init__(self, gateway: EngineGateway, capabilities: Capabilities, settings: ServerSettings,
                 files: FileStore):
        self.gateway = gateway
        self.capabilities = capabilities
        self.settings = settings
        self.files = files

    async def generate(self, body: ImageGenerationRequest, request: Request) -> ImagesResponse | AsyncIterator[str]:
        self.capabilities.require("images.generations")
        params = self._params(body, decode_extras=False)
        if body.stream:
            stream = await self.gateway.open(body.prompt, params, new_request_id("img"), session_id=body.user)
            return self._events(stream, body, "image_generation")
        out = await self.gateway.run(body.prompt, params, new_request_id("img"), request, session_id=body.user)
        return await self._respond(out.images or [], body, request)

    async def edit(self, form: Form, request: Request) -> ImagesResponse:
        self.capabilities.require("images.edits")
        body: ImageEditRequest = validate(ImageEditRequest, form.fields)
        params = self._params(body, decode_extras=True)
        uploads = form.files.get("image", [])
        if not uploads:
            raise bad_request("image: at least one input image is required", param="image")
        if len(uploads) > MAX_INPUT_IMAGES:
            raise bad_request(f"image: at most {MAX_INPUT_IMAGES} images, got {len(uploads)}", param="image")
        media = request.app.state.media  # decodes within the input limits, off the event loop
        images = [await media.image(await read_upload(u, "image"), f"image[{i}]") for i, u in enumerate(uploads)]
        masks = form.files.get("mask", [])
        if len(masks) > 1:
            raise bad_request("mask: give at most one mask", param="mask")
        mask = _read_mask(await media.image(await read_upload(masks[0], "mask"), "mask", mode=None),
                          images[0]) if masks else None
        prompt = {"prompt": body.prompt, "image": images if len(images) > 1 else images[0]}
        keep = (lambda result: _composite(images[0], result, mask)) if mask is not None else None
        if body.stream:
            stream = await self.gateway.open(prompt, params, new_request_id("imgedit"))
            return self._events(stream, body, "image_edit", keep)
        out = await self.gateway.run(prompt, params, new_request_id("imgedit"), request)
        results = [keep(r) if keep else r for r in out.images or []]
        return await self._respond(results, body, request)

    def _params(self, body: ImageRequestFields, decode_extras: bool) -> DiffusionParams:
        check_model(body.model, self.settings)
        check_n(body.n, self.settings)
        width = height = None
        if body.size is not None and body.size != "auto":
            width, height = parse_size(body.size, self.settings)
        try:
            return DiffusionParams(height=height, width=width, num_outputs_per_prompt=body.n,
                                   partial_images=body.partial_images if body.stream else 0,
                                   extras=body.extras(decode_strings=decode_extras), **body.diffusion_fields())
        except ValueError as e:
            raise from_value_error(e) from None

    async def _respond(self, images: list[Any], body: ImageRequestFields, request: Request) -> ImagesResponse:
        encoded = await asyncio.to_thread(lambda: [encode_image(img, body.output_format) for img in images])
        data = []
        for payload in encoded:
            if body.response_format == "b64_json":
                data.append(ImageData(b64_json=base64.b64encode(payload).decode()))
            else:
                name, _ = self.files.put(payload, "." + body.output_format)
                data.append(ImageData(url=f"{str(request.base_url).rstrip('/')}/files/{name}"))
        size = f"{images[0].width}x{images[0].height}" if images else body.size or "auto"
        return ImagesResponse(created=int(time.time()), data=data, output_format=body.output_format, size=size)


    async def _events(self, stream: RequestStream, body: ImageRequestFields, kind: str,
                      keep: Any = None) -> AsyncIterator[str]:
        """SSE of one request: its partial images as they come, then each final image. The
        request is aborted if the client goes away (the generator is closed)."""
        num_partial = 0
        try:
            async for out in stream:
                preview = out.progress.preview if out.progress is not None else None
                if preview is not None:
                    yield _event(f"{kind}.partial_image", self._image_event(
                        preview, body, partial_image_index=num_partial))
                    num_partial += 1
                if out.finished:
                    for image in out.images or []:
                        yield _event(f"{kind}.completed", self._image_event(
                            keep(image) if keep else image, body, usage=_ZERO_USAGE))
        except APIError as e:
            yield _event("error", e.body())

    def _image_event(self, image: Any, body: ImageRequestFields, **fields: Any) -> dict[str, Any]:
        data = encode_image(image, body.output_format)
        return {"b64_json": base64.b64encode(data).decode(), "background": "opaque", "created_at": int(time.time()),
                "output_format": body.output_format, "quality": "auto", "size": f"{image.width}x{image.height}",
                **fields}


# Diffusion models count no tokens; the field is there because OpenAI's completed events carry it.
_ZERO_USAGE = {"input_tokens": 0, "input_tokens_details": {"image_tokens": 0, "text_tokens": 0},
               "output_tokens": 0, "total_tokens": 0}


def _event(kind: str, payload: dict[str, Any]) -> str:
    payload = {**payload, "type": kind} if kind != "error" else payload
    return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _read_mask(mask: Image.Image, image: Image.Image) -> Image.Image:
    """OpenAI's mask: an RGBA image the size of the (first) input image, transparent
    (alpha 0) where the image should change. Returned as its alpha channel."""
    if "A" not in mask.getbands():
        raise bad_request("mask: needs an alpha channel (transparent where the image should be edited)",
                          param="mask")
    if mask.size != image.size:
        raise bad_request(f"mask: must be the size of the image {image.width}x{image.height}, "
                          f"got {mask.width}x{mask.height}", param="mask")
    return mask.getchannel("A")


def _composite(original: Image.Image, result: Image.Image, alpha: Image.Image) -> Image.Image:
    """Keep the original where the mask is opaque, the edit where it is transparent."""
    size = result.size
    return Image.composite(original.convert(result.mode).resize(size), result, alpha.resize(size))
