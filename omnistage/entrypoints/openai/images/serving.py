"""Images: build the diffusion request, run it, encode the answer as base64 or a URL."""

from __future__ import annotations

import asyncio
import base64
import time
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
from omnistage.entrypoints.openai.engine_client import EngineGateway, new_request_id
from omnistage.entrypoints.openai.errors import bad_request, from_value_error
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

    async def generate(self, body: ImageGenerationRequest, request: Request) -> ImagesResponse:
        self.capabilities.require("images.generations")
        params = self._params(body, decode_extras=False)
        out = await self.gateway.run(body.prompt, params, new_request_id("img"), request)
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
        out = await self.gateway.run(prompt, params, new_request_id("imgedit"), request)
        results = out.images or []
        if mask is not None:
            results = [_composite(images[0], result, mask) for result in results]
        return await self._respond(results, body, request)

    def _params(self, body: ImageRequestFields, decode_extras: bool) -> DiffusionParams:
        check_model(body.model, self.settings)
        check_n(body.n, self.settings)
        width = height = None
        if body.size is not None and body.size != "auto":
            width, height = parse_size(body.size, self.settings)
        try:
            return DiffusionParams(height=height, width=width, num_outputs_per_prompt=body.n,
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
