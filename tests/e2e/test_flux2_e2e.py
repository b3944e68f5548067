"""FLUX.2-dev behind `omnistage serve`, driven by the official `openai` client: text to image,
and edits with one and with two reference images (FLUX.2 serves both image routes)."""

from __future__ import annotations

import base64
import io

import openai
import pytest
from PIL import Image
from remote_server import RemoteServer

pytestmark = pytest.mark.e2e

# Few steps; FLUX.2's system message takes ~120 tokens of the tiny tokenizer.
FAST = {"num_inference_steps": 2, "max_sequence_length": 160}


def _png(size=(64, 64)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


def _size(b64: str) -> tuple[int, int]:
    return Image.open(io.BytesIO(base64.b64decode(b64))).size


def test_flux2_generates_edits_and_names_bad_fields(zoo):
    with RemoteServer(zoo("flux2"), in_process=True) as server:
        client = server.client()
        result = client.images.generate(prompt="a cat", size="64x32", n=2, response_format="b64_json",
                                        extra_body=FAST)
        assert [_size(d.b64_json) for d in result.data] == [(64, 32), (64, 32)]
        assert result.data[0].b64_json != result.data[1].b64_json  # two samples of one request

        # A reference image; without a size the output takes the image's.
        edited = client.images.edit(image=("in.png", _png((96, 64)), "image/png"), prompt="make it blue",
                                    response_format="b64_json", extra_body=FAST)
        assert _size(edited.data[0].b64_json) == (96, 64)
        # Several reference images (sent as image[]): the output takes the first one's size.
        edited = client.images.edit(image=[("a.png", _png((96, 64)), "image/png"), ("b.png", _png(), "image/png")],
                                    prompt="put them together", response_format="b64_json", extra_body=FAST)
        assert _size(edited.data[0].b64_json) == (96, 64)

        with pytest.raises(openai.BadRequestError) as bad:
            client.images.generate(prompt="a cat", size="64x64", extra_body={**FAST, "negative_prompt": "blurry"})
        assert bad.value.body["param"] == "negative_prompt"
        with pytest.raises(openai.BadRequestError, match="16"):
            client.images.generate(prompt="a cat", size="64x40", extra_body=FAST)
