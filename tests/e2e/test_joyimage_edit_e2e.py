"""JoyAI-Image-Edit behind `omnistage serve`, driven by the official `openai` client: an edit of
one input image through /v1/images/edits equals our pipeline's output for the same inputs in
process, and a second image or a size that does not divide is a 400 naming its field."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
from PIL import Image
from remote_server import RemoteServer

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.testing.diffusion_models import default_input_image

pytestmark = pytest.mark.e2e

FIELDS = {"num_inference_steps": 2, "seed": 5, "negative_prompt": "blurry", "guidance_scale": 3.0}


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _expected(path, image: Image.Image, prompt: str) -> np.ndarray:
    from omnistage.models.joyimage.pipeline import JoyImageEdit

    params = DiffusionParams(height=32, width=64, **FIELDS)
    (payload,) = JoyImageEdit.from_pretrained(path).forward([DiffusionRequest("r", prompt, params, images=[image])])
    return np.asarray(payload.images[0], dtype=np.int16)


def test_joyimage_edit_through_the_server(zoo):
    path, image = zoo("joyai-image-edit"), default_input_image()
    with RemoteServer(path, in_process=True) as server:
        client = server.client()
        result = client.images.edit(image=("in.png", _png(image), "image/png"), prompt="make the sky purple",
                                    size="64x32", response_format="b64_json", extra_body=FIELDS)
        got = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json)))
        assert got.size == (64, 32)

        for kwargs, param in [({"image": [("a.png", _png(image), "image/png")] * 2, "size": "64x32"}, "image"),
                              ({"image": ("a.png", _png(image), "image/png"), "size": "40x32"}, "width")]:
            with pytest.raises(openai.BadRequestError) as bad:
                client.images.edit(prompt="x", extra_body={"num_inference_steps": 1}, **kwargs)
            assert bad.value.body["param"] == param

    want = _expected(path, image, "make the sky purple")
    assert np.abs(np.asarray(got.convert("RGB"), dtype=np.int16) - want).max() <= 1
