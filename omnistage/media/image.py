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


def decode_image(data: bytes, field: str = "image") -> Image.Image:
    """Open image bytes as RGB; a ValueError names `field` when the bytes are not an image."""
    try:
        img = Image.open(io.BytesIO(data))
        img.load()
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"{field}: not a decodable image ({e})") from None
    return img.convert("RGB")


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
