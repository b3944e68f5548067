"""GLM-Image served by `omnistage serve` (the AR prior and the DiT, two stages), driven by the
official `openai` client: the PNG it returns is diffusers' GlmImagePipeline image for the seed."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
import torch
from PIL import Image
from remote_server import RemoteServer

pytestmark = pytest.mark.e2e


def test_glm_image_generations_match_the_reference(zoo):
    from diffusers import GlmImagePipeline

    path = zoo("glm-image")
    with RemoteServer(path, "--served-model-name", "glm-image", in_process=True) as server:
        client = server.client()
        result = client.images.generate(model="glm-image", prompt="a red square", size="64x64",
                                        response_format="b64_json",
                                        extra_body={"num_inference_steps": 2, "guidance_scale": 1.5, "seed": 4})
        got = np.asarray(Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))).convert("RGB")) / 255

        with pytest.raises(openai.BadRequestError, match="width must be divisible by 32") as bad:
            client.images.generate(prompt="x", size="48x64")  # width x height
        assert bad.value.body["param"] == "width"

    reference = GlmImagePipeline.from_pretrained(str(path), dtype=torch.float32)
    reference.set_progress_bar_config(disable=True)
    want = reference(prompt="a red square", height=64, width=64, num_inference_steps=2, guidance_scale=1.5,
                     generator=torch.Generator().manual_seed(4), output_type="np").images[0]
    assert got.shape == want.shape and np.abs(got - want).max() <= 1 / 255 + 1e-6
