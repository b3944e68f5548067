"""Per-request LoRA through the images route: `extra_body={"lora": {...}}` over a real Z-Image
engine whose deploy config preloads two adapters; an unknown adapter name is a 400 naming it."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from omnistage import Omni
from omnistage.entrypoints.openai.api_server import create_app
from omnistage.entrypoints.openai.settings import ServerSettings
from omnistage.testing.lora import build_lora

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(zoo, tmp_path_factory):
    path = zoo("z-image")
    out = tmp_path_factory.mktemp("lora")
    adapters = {name: str(build_lora(path, out / f"{name}.safetensors", seed=seed))
                for name, seed in (("style", 1), ("other", 2))}
    with Omni(path, stage_overrides={"0": {"lora_adapters": adapters}}) as omni:
        app = create_app(ServerSettings(served_model_name="z-image", model_path=str(path)), omni.async_omni)
        with TestClient(app) as http:
            yield openai.OpenAI(base_url=str(http.base_url) + "/v1", api_key="none", http_client=http,
                                max_retries=0)


def generate(client, **extra) -> np.ndarray:
    result = client.images.generate(prompt="a cat", size="32x32", response_format="b64_json",
                                    extra_body={"num_inference_steps": 2, "seed": 3, **extra})
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))), dtype=np.int16)


def test_requests_choose_their_adapter(client):
    base = generate(client)
    style = generate(client, lora={"name": "style"})
    assert np.abs(style - base).max() > 0
    assert np.array_equal(generate(client, lora={"name": "style", "scale": 0.0}), base)
    assert np.array_equal(generate(client, lora={"name": "style", "scale": 1.0}), style)


def test_unknown_adapter_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as info:
        generate(client, lora={"name": "nope"})
    error = info.value.body
    assert "unknown adapter 'nope'" in error["message"] and "other, style" in error["message"]
    assert error["param"] == "lora.name"
