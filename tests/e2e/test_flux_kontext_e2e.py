"""FLUX.1-Kontext behind `omnistage serve`, driven by the official `openai` client: an edit of
one input image (and a text-only generation: the image is optional), and its fields named
when wrong."""

from __future__ import annotations

import base64
import io

import openai
import pytest
from PIL import Image
from remote_server import RemoteServer

pytestmark = pytest.mark.e2e

# Few steps; the input image kept at its own size (auto-resize would make it a megapixel).
FAST = {"num_inference_steps": 2, "max_sequence_length": 64, "auto_resize": False}


def _png(size=(64, 64)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


def _size(b64: str) -> tuple[int, int]:
    return Image.open(io.BytesIO(base64.b64decode(b64))).size


def test_flux_kontext_edits_generates_and_names_bad_fields(zoo):
    with RemoteServer(zoo("flux-kontext"), in_process=True) as server:
        client = server.client()
        edited = client.images.edit(image=("in.png", _png((96, 64)), "image/png"), prompt="make it blue",
                                    size="64x32", n=2, response_format="b64_json", extra_body=FAST)
        assert [_size(d.b64_json) for d in edited.data] == [(64, 32), (64, 32)]  # the size asked for
        generated = client.images.generate(prompt="a cat", size="64x64", response_format="b64_json", extra_body=FAST)
        assert _size(generated.data[0].b64_json) == (64, 64)

        with pytest.raises(openai.BadRequestError) as bad:  # too small to keep at its own size
            client.images.edit(image=("in.png", _png((8, 8)), "image/png"), prompt="make it blue", size="64x64",
                               extra_body=FAST)
        assert bad.value.body["param"] == "image"
        with pytest.raises(openai.BadRequestError) as bad:
            client.images.edit(image=("in.png", _png(), "image/png"), prompt="make it blue", size="64x64",
                               extra_body={**FAST, "max_area": 4096})
        assert bad.value.body["param"] == "max_area"
