"""Deploy defaults are filled in the engine only: the server passes the fields a client gave,
so a deploy default applies to a bare request through HTTP and through `Omni` alike, and a
client's own value wins. Real tiny zoo models, the real app and engines."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from omnistage import AsyncOmni, Omni, SamplingParams
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

pytestmark = pytest.mark.usefixtures("one_thread")

# ignore_eos: random weights may say EOS early, and the test counts tokens.
DEPLOY = {"0": {"default_sampling_params": {"max_tokens": 3, "temperature": 0.0, "ignore_eos": True}}}
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def llm_http(zoo):
    engine = AsyncOmni(zoo("qwen2-llm"), stage_overrides=DEPLOY)
    with TestClient(create_app(ServerSettings(served_model_name="m", model_path="m"), engine)) as http:
        yield http


def completion_tokens(http, route, body):
    resp = http.post(route, json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()["usage"]["completion_tokens"]


@pytest.mark.parametrize("route, body", [("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": "hi"})])
def test_a_deploy_default_applies_over_http_and_the_clients_value_wins(llm_http, route, body):
    assert completion_tokens(llm_http, route, body) == 3
    assert completion_tokens(llm_http, route, {**body, "max_tokens": 5}) == 5
    # Two choices are two params built from one: the copies keep the deploy default too.
    assert completion_tokens(llm_http, route, {**body, "n": 2}) == 6


def test_a_deploy_default_applies_through_omni_and_the_callers_value_wins(zoo):
    with Omni(zoo("qwen2-llm"), stage_overrides=DEPLOY) as omni:
        [bare] = omni.generate("hi", SamplingParams(seed=1), use_tqdm=False)
        [given] = omni.generate("hi", SamplingParams(max_tokens=5), use_tqdm=False)
    assert len(bare.token_ids) == 3 and len(given.token_ids) == 5


def test_unset_fields_stay_unset_through_a_route_fallback_and_replace():
    deploy = SamplingParams.from_dict({"max_tokens": 7, "top_k": 20})
    chat = SamplingParams.from_dict({"temperature": 0}, fallback={"max_tokens": None})
    assert chat.fields_set == {"temperature"} and chat.max_tokens is None
    assert chat.with_defaults(deploy) == SamplingParams(max_tokens=7, temperature=0, top_k=20)
    assert chat.with_defaults(SamplingParams()) == SamplingParams(max_tokens=None, temperature=0)
    assert chat.replace(seed=3).with_defaults(deploy) == SamplingParams(max_tokens=7, temperature=0, top_k=20, seed=3)
