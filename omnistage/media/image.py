"""Image encode/decode for the API: PNG/JPEG/WebP bytes and base64 data URLs."""

from __future__ import annotations

import base64
import binascii
import io

from PIL import Image, UnidentifiedImageError

IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG", "jpg": "JPEG", "webp": "WEBP"}


def encode_image(image: Image.Image, fmt: str = "png", quality: int = 95) -> bytes:
    fmt = fmt.lower()
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"output_format: unsupported image format {fmt!r}; use one of {sorted(set(IMAGE_FORMATS))}")
    buf = io.BytesIO()
    pil_format = IMAGE_FORMATS[fmt]
    img = image.convert("RGB") if pil_format == "JPEG" else image
    img.save(buf, format=pil_format, **({"quality": quality} if pil_format != "PNG" else {}))
    return buf.getvalue()


class ImageTooLargeError(ValueError):
    """An input image has more pixels than allowed (read from its header, before decoding)."""


def open_image(data: bytes, field: str = "image", max_pixels: int | None = None) -> Image.Image:
    """Open image bytes and decode them, refusing by its header any image over `max_pixels`
    or over Pillow's decompression-bomb limit before a pixel is decoded: a small PNG can
    declare 20000x20000 pixels (1.2 GB decoded). Errors are ValueErrors naming `field`."""
    try:
        img = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError as e:
        raise ImageTooLargeError(f"{field}: the image is too large ({e})") from None
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"{field}: not a decodable image ({e})") from None
    width, height = img.size
    limits = [n for n in (max_pixels, Image.MAX_IMAGE_PIXELS) if n]
    limit = min(limits) if limits else None
    if limit is not None and width * height > limit:
        raise ImageTooLargeError(f"{field}: {width}x{height} is {width * height} pixels, over the server's limit "
                                 f"of {limit} input pixels")
    try:
        img.load()
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"{field}: not a decodable image ({e})") from None
    return img


def decode_image(data: bytes, field: str = "image", max_pixels: int | None = None) -> Image.Image:
    """Open image bytes as RGB (see `open_image` for the size limits)."""
    return open_image(data, field, max_pixels).convert("RGB")


def decode_base64_payload(data: str, field: str) -> bytes:
    """Bytes from a base64 string or a `data:<mime>;base64,...` URL."""
    if data.startswith("data:"):
        header, _, data = data.partition(",")
        if ";base64" not in header:
            raise ValueError(f"{field}: only base64 data URLs are supported")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{field}: invalid base64 data") from None


def image_to_data_url(image: Image.Image, fmt: str = "png") -> str:
    mime = "jpeg" if fmt in ("jpg", "jpeg") else fmt
    return f"data:image/{mime};base64," + base64.b64encode(encode_image(image, fmt)).decode()
