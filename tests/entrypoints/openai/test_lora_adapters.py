"""The LoRA adapter routes over a real Z-Image engine with `max_loras: 1` and one adapter declared
at start-up: POST /v1/lora_adapters loads one by path that requests then name, GET lists both
kinds, DELETE unloads it; a bad file is a 400 naming `path` that loads nothing, and a request's
`lora: {name, path}` is loaded on first use."""

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
    files = {name: str(build_lora(path, out / f"{name}.safetensors", seed=seed))
             for name, seed in (("style", 1), ("other", 2))}
    overrides = {"0": {"lora_adapters": {"style": files["style"]}, "max_loras": 1}}
    with Omni(path, stage_overrides=overrides) as omni:
        app = create_app(ServerSettings(served_model_name="z-image", model_path=str(path)), omni.async_omni)
        with TestClient(app) as http:
            client = openai.OpenAI(base_url=str(http.base_url) + "/v1", api_key="none", http_client=http,
                                   max_retries=0)
            yield http, client, files


def generate(client, **extra) -> np.ndarray:
    result = client.images.generate(prompt="a cat", size="32x32", response_format="b64_json",
                                    extra_body={"num_inference_steps": 2, "seed": 3, **extra})
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))), dtype=np.int16)


def listed(http) -> dict[str, dict]:
    answer = http.get("/v1/lora_adapters")
    assert answer.status_code == 200, answer.text
    return {a["name"]: a for a in answer.json()["data"]}


def test_load_list_use_and_unload(server):
    http, client, files = server
    assert listed(http) == {"style": {"name": "style", "path": files["style"], "loaded": True, "source": "deploy",
                                      "stage": "diffusion"}}
    answer = http.post("/v1/lora_adapters", json={"name": "ink", "path": files["other"]})
    assert answer.status_code == 200, answer.text
    assert listed(http)["ink"] == {"name": "ink", "path": files["other"], "loaded": True, "source": "path",
                                   "stage": "diffusion"}
    base, style, ink = generate(client), generate(client, lora={"name": "style"}), generate(client, lora={"name": "ink"})
    assert np.abs(ink - base).max() > 0 and np.abs(ink - style).max() > 0
    # The same file loaded by a request under another name: the same image.
    assert np.array_equal(generate(client, lora={"name": "ink2", "path": files["other"]}), ink)
    assert listed(http)["ink"]["loaded"] is False  # max_loras 1: "ink" made room for "ink2"...
    assert np.array_equal(generate(client, lora={"name": "ink"}), ink)  # ...and loads again by name

    assert http.delete("/v1/lora_adapters/ink").status_code == 200
    assert "ink" not in listed(http)
    with pytest.raises(openai.BadRequestError) as info:
        generate(client, lora={"name": "ink"})
    assert info.value.body["param"] == "lora.name"
    refused = http.delete("/v1/lora_adapters/style")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "name"


def test_bad_file_is_a_400_naming_path_and_loads_nothing(server, tmp_path):
    http, client, _ = server
    before = listed(http)
    bad = tmp_path / "bad.safetensors"
    bad.write_text("not safetensors")
    for file in (bad, tmp_path / "missing.safetensors"):
        answer = http.post("/v1/lora_adapters", json={"name": "bad", "path": str(file)})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "path", answer.text
        with pytest.raises(openai.BadRequestError) as info:
            generate(client, lora={"name": "bad", "path": str(file)})
        assert info.value.body["param"] == "lora.path"
    assert listed(http) == before
