"""Multi-image edits: `omnistage serve` on the tiny Qwen-Image-Edit-Plus, driven by the `openai` client.

`images.edit(image=[a, b])` sends the images as `image[]` parts of one multipart form; the
answer must be what our pipeline makes from both images in process (so both reached the
model, in order), and more images than the model takes is a 400 naming `image`.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
from PIL import Image, ImageOps
from remote_server import RemoteServer

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.testing.diffusion_models import default_input_image
from omnistage.testing.qwen_image_edit_plus_models import NAME

pytestmark = pytest.mark.e2e

FIELDS = {"num_inference_steps": 2, "seed": 7, "negative_prompt": "blurry", "true_cfg_scale": 2.0}


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _expected(path, images: list[Image.Image], prompt: str) -> np.ndarray:
    """Our pipeline's image for the same inputs, run in this process."""
    from omnistage.models.qwen_image.edit_plus_pipeline import QwenImageEditPlus

    pipeline = QwenImageEditPlus.from_pretrained(path)
    params = DiffusionParams(height=32, width=64, **FIELDS)
    (payload,) = pipeline.forward([DiffusionRequest("r", prompt, params, images=images)])
    return np.asarray(payload.images[0], dtype=np.int16)


def test_edit_from_two_images_and_too_many_rejected(zoo):
    path = zoo(NAME)
    a, b = default_input_image(), ImageOps.mirror(default_input_image()).resize((64, 32))
    with RemoteServer(path, in_process=True) as server:
        client = server.client()
        result = client.images.edit(image=[("a.png", _png(a), "image/png"), ("b.png", _png(b), "image/png")],
                                    prompt="put the cat from picture 1 into picture 2", size="64x32",
                                    response_format="b64_json", extra_body=FIELDS)
        (data,) = result.data
        got = Image.open(io.BytesIO(base64.b64decode(data.b64_json)))
        assert got.size == (64, 32)

        four = [(f"{i}.png", _png(a), "image/png") for i in range(4)]
        with pytest.raises(openai.BadRequestError) as info:
            client.images.edit(image=four, prompt="x", size="64x32", extra_body={"num_inference_steps": 1})
        assert info.value.body["param"] == "image" and "1 to 3 input images" in info.value.body["message"]

    want = _expected(path, [a, b], "put the cat from picture 1 into picture 2")
    assert np.abs(np.asarray(got.convert("RGB"), dtype=np.int16) - want).max() <= 1
