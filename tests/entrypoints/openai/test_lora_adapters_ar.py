"""LoRA adapters of a text LLM's native AR stage over HTTP (the zoo's qwen2-llm, `max_loras: 1`, one peft
adapter declared): chat and completions take `lora` by name, or by `path` loaded on first use, and answer
with transformers + peft's greedy text, as they do when `model` names the adapter (vLLM's convention);
the adapter routes list, load and unload the stage's adapters; a bad folder is a 400 naming `lora.path`
(or `path`) and loads nothing."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from omnistage import AsyncOmni
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app
from omnistage.testing.lora import build_peft_lora

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "The quick brown fox jumps over the lazy dog."
GREEDY = {"max_tokens": 5, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def adapters(zoo, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("peft")
    return {name: str(build_peft_lora(zoo("qwen2-llm"), out / name, targets, seed=seed))
            for name, targets, seed in (("a", ("q_proj", "v_proj"), 1), ("b", ("o_proj", "up_proj"), 2))}


@pytest.fixture(scope="module")
def http(zoo, adapters):
    overrides = {"0": {"lora_adapters": {"a": adapters["a"]}, "max_loras": 1}}
    engine = AsyncOmni(zoo("qwen2-llm"), stage_overrides=overrides)
    with TestClient(create_app(ServerSettings(served_model_name="m", model_path="m"), engine)) as client:
        yield client


def peft_text(zoo, adapter: str | None) -> str:
    """transformers (+ peft) greedy text of PROMPT, as the completions route decodes it."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(zoo("qwen2-llm"))
    model = AutoModelForCausalLM.from_pretrained(zoo("qwen2-llm"), dtype=torch.float32).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).eval()
    ids = torch.tensor([tokenizer(PROMPT).input_ids])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def completion(http, **extra) -> str:
    resp = http.post("/v1/completions", json={"prompt": PROMPT, **GREEDY, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["text"]


def listed(http) -> dict[str, dict]:
    resp = http.get("/v1/lora_adapters")
    assert resp.status_code == 200, resp.text
    return {a["name"]: a for a in resp.json()["data"]}


def test_requests_pick_an_adapter_by_name_or_path(http, zoo, adapters):
    assert completion(http) == peft_text(zoo, None)
    assert completion(http, lora={"name": "a"}) == peft_text(zoo, adapters["a"]) != completion(http)
    assert completion(http, lora={"name": "b", "path": adapters["b"]}) == peft_text(zoo, adapters["b"])
    chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **GREEDY,
                                                   "lora": {"name": "b"}})
    assert chat.status_code == 200, chat.text
    assert listed(http)["b"] == {"name": "b", "path": adapters["b"], "loaded": True, "source": "path", "stage": "llm"}


def test_model_may_name_an_adapter(http):
    assert completion(http, model="a") == completion(http, lora={"name": "a"}) != completion(http, model="m")
    chat = {"messages": [{"role": "user", "content": "hi"}], **GREEDY}
    answers = [http.post("/v1/chat/completions", json={**chat, **extra}) for extra in
               ({"model": "a"}, {"lora": {"name": "a"}})]
    assert [r.status_code for r in answers] == [200, 200], answers[0].text
    assert answers[0].json()["choices"][0]["message"] == answers[1].json()["choices"][0]["message"]
    resp = http.post("/v1/completions", json={"prompt": PROMPT, "model": "nope"})
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "model", resp.text
    resp = http.post("/v1/completions", json={"prompt": PROMPT, "model": "a", "lora": {"name": "b"}})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "lora", resp.text


def test_the_routes_load_and_unload_and_a_bad_folder_loads_nothing(http, adapters, tmp_path):
    before = listed(http)
    resp = http.post("/v1/completions", json={"prompt": PROMPT, "lora": {"name": "c", "path": str(tmp_path)}})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "lora.path", resp.text
    resp = http.post("/v1/lora_adapters", json={"name": "c", "path": str(tmp_path / "none")})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "path", resp.text
    assert listed(http) == before
    resp = http.post("/v1/lora_adapters", json={"name": "c", "path": adapters["b"]})
    assert resp.status_code == 200, resp.text
    assert listed(http)["c"]["loaded"] and completion(http, lora={"name": "c"}) == completion(http, lora={"name": "b"})
    assert http.delete("/v1/lora_adapters/c").status_code == 200
    assert "c" not in listed(http)
