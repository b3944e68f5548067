"""Qwen-Image 2.1: `omnistage serve` on the tiny zoo model, driven by the `openai` client.

`images.generate` must answer what our pipeline makes in process for the same fields (the
model draws RGBA, so the PNG keeps its alpha), and the edit route takes a condition image.
"""

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
from omnistage.testing.qwen_image21_models import NAME

pytestmark = pytest.mark.e2e

FIELDS = {"num_inference_steps": 2, "seed": 5, "negative_prompt": "blurry", "true_cfg_scale": 2.0}
PROMPT = "a lighthouse on a cliff at dawn"


def _expected(path) -> np.ndarray:
    from omnistage.models.qwen_image.v21_pipeline import QwenImage21

    pipeline = QwenImage21.from_pretrained(path)
    params = DiffusionParams(height=32, width=64, **FIELDS)
    (payload,) = pipeline.forward([DiffusionRequest("r", PROMPT, params)])
    return np.asarray(payload.images[0], dtype=np.int16)


def test_generation_and_edit_routes(zoo):
    path = zoo(NAME)
    with RemoteServer(path, in_process=True) as server:
        client = server.client()
        result = client.images.generate(prompt=PROMPT, size="64x32", response_format="b64_json", extra_body=FIELDS)
        (data,) = result.data
        got = Image.open(io.BytesIO(base64.b64decode(data.b64_json)))
        assert got.size == (64, 32) and got.mode == "RGBA"
        # A condition image (the tiny processor reads 64x64 pixels: output_resolution 64 keeps it there).
        image = io.BytesIO()
        default_input_image().save(image, format="PNG")
        edited = client.images.edit(image=("in.png", image.getvalue(), "image/png"), prompt="make it blue",
                                    response_format="b64_json", extra_body={**FIELDS, "output_resolution": 64})
        assert Image.open(io.BytesIO(base64.b64decode(edited.data[0].b64_json))).size == (64, 64)
        with pytest.raises(openai.BadRequestError) as bad:
            client.images.edit(image=("in.png", image.getvalue(), "image/png"), prompt="x",
                               extra_body={"output_resolution": 8})
        assert bad.value.body["param"] == "output_resolution"
    assert np.abs(np.asarray(got, dtype=np.int16) - _expected(path)).max() <= 1
