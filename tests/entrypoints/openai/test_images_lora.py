"""Per-request LoRA through the images route: `extra_body={"lora": {...}}` over a real Z-Image
engine whose deploy config preloads two adapters; an unknown adapter name is a 400 naming it.
Without `max_loras` nothing loads by path: a request's `lora.path` is a 400 naming it, and the
load route refuses (test_lora_adapters.py has the stage that does)."""

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
def server(zoo, tmp_path_factory):
    path = zoo("z-image")
    out = tmp_path_factory.mktemp("lora")
    adapters = {name: str(build_lora(path, out / f"{name}.safetensors", seed=seed))
                for name, seed in (("style", 1), ("other", 2))}
    with Omni(path, stage_overrides={"0": {"lora_adapters": adapters}}) as omni:
        app = create_app(ServerSettings(served_model_name="z-image", model_path=str(path)), omni.async_omni)
        with TestClient(app) as http:
            yield http, openai.OpenAI(base_url=str(http.base_url) + "/v1", api_key="none", http_client=http,
                                      max_retries=0)


@pytest.fixture(scope="module")
def client(server):
    return server[1]


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


def test_no_adapter_loads_by_path_without_max_loras(server, tmp_path):
    http, client = server
    with pytest.raises(openai.BadRequestError) as info:
        generate(client, lora={"name": "new", "path": str(tmp_path / "x.safetensors")})
    assert info.value.body["param"] == "lora.path" and "max_loras: 0" in info.value.body["message"]
    assert [a["name"] for a in http.get("/v1/lora_adapters").json()["data"]] == ["other", "style"]
    answer = http.post("/v1/lora_adapters", json={"name": "new", "path": str(tmp_path / "x.safetensors")})
    assert answer.status_code == 409 and "max_loras: 0" in answer.json()["error"]["message"]
