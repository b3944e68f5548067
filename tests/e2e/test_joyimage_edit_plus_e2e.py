"""JoyAI-Image-Edit-Plus behind `omnistage serve`, driven by the official `openai` client: an edit
of two reference images (`image[]` parts of one form) through /v1/images/edits equals our
pipeline's output for the same inputs in process (so both reached the model, in order), and
a size that does not divide is a 400 naming its field. The references' buckets are shrunk as in
the parity test (the server runs in this process)."""

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
from omnistage.testing.joyimage_models import plus_references as references
from omnistage.testing.joyimage_models import small_buckets

pytestmark = pytest.mark.e2e

FIELDS = {"num_inference_steps": 1, "seed": 5, "negative_prompt": "blurry", "guidance_scale": 3.0}


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _expected(path, image_orders: list[list[Image.Image]], prompt: str) -> list[np.ndarray]:
    """Our pipeline's image for each order of the references, run in this process."""
    from omnistage.models.joyimage.plus import JoyImageEditPlus

    pipeline = JoyImageEditPlus.from_pretrained(path)
    params = DiffusionParams(height=32, width=64, **FIELDS)
    payloads = pipeline.forward([DiffusionRequest(f"r{i}", prompt, params, images=images)
                                 for i, images in enumerate(image_orders)])
    return [np.asarray(payload.images[0], dtype=np.int16) for payload in payloads]


def test_joyimage_edit_plus_through_the_server(zoo):
    path, images = zoo("joyai-image-edit-plus"), references()
    parts = [(f"{i}.png", _png(image), "image/png") for i, image in enumerate(images)]
    with small_buckets(), RemoteServer(path, in_process=True) as server:
        client = server.client()
        result = client.images.edit(image=parts, prompt="put the cat into the second picture", size="64x32",
                                    response_format="b64_json", extra_body=FIELDS)
        got = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json)))
        assert got.size == (64, 32)
        with pytest.raises(openai.BadRequestError) as bad:
            client.images.edit(image=parts, prompt="x", size="40x32", extra_body={"num_inference_steps": 1})
        assert bad.value.body["param"] == "width"
        want, swapped = _expected(path, [images, images[::-1]], "put the cat into the second picture")
    got = np.asarray(got.convert("RGB"), dtype=np.int16)
    assert np.abs(got - want).max() <= 1 and np.abs(got - swapped).max() > 1
