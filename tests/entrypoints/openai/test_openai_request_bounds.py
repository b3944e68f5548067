"""Every request field is bounded before it reaches a tokenizer, a sampler or a model: the
hostile requests that once took a stage down (a `max_sequence_length` of 2**63 panicked the
tokenizer) answer a 400 naming the field, and the server serves the next request.

Real tiny zoo models behind the real app, one server per model for the module. The same on a
process or mp stage: tests/e2e/test_self_healing_e2e.py sends it to its servers before the kill."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from omnistage import AsyncOmni
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

pytestmark = pytest.mark.usefixtures("one_thread")

CHEAP_IMAGE = {"prompt": "a cat", "size": "32x32", "num_inference_steps": 1}


def serve(path, overrides=None):
    engine = AsyncOmni(path, stage_overrides=overrides or {})
    app = create_app(ServerSettings(served_model_name="m", model_path=str(path)), engine)
    return TestClient(app)


@pytest.fixture(scope="module")
def image_http(zoo):
    with serve(zoo("z-image")) as http:
        yield http


def assert_refused(resp, param):
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.json()


@pytest.mark.parametrize("value", [2**63, 10**30, 4096, 2**63 - 1])
def test_max_sequence_length_beyond_the_checkpoint_is_a_400_and_the_server_stays_up(image_http, value):
    resp = image_http.post("/v1/images/generations", json={**CHEAP_IMAGE, "max_sequence_length": value})
    assert_refused(resp, "max_sequence_length")
    if value < 2**63:  # past int64 the JSON bound answers first; within it, the checkpoint's limit
        assert "1024" in resp.json()["error"]["message"]  # the zoo tokenizer's model_max_length
    assert image_http.get("/health").status_code == 200
    assert image_http.post("/v1/images/generations", json=CHEAP_IMAGE).status_code == 200


def test_the_checkpoint_limit_lowers_the_declared_cap_and_is_listed(zoo):
    from omnistage.diffusion.checkpoint import CheckpointConfigs
    from omnistage.models.z_image.pipeline import ZImage

    configs = CheckpointConfigs.read(str(zoo("z-image")))
    assert configs.max_text_tokens(("tokenizer", "text_encoder")) == 1024
    checker = ZImage.for_requests(configs)
    assert checker.extras["max_sequence_length"].max == 1024
    assert ZImage.extras["max_sequence_length"].max is None  # the class declares no cap of its own


@pytest.fixture(scope="module")
def llm_http(zoo):
    with serve(zoo("qwen2-llm")) as http:
        yield http


@pytest.mark.parametrize("route, body, param", [
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": 5}, "stop_token_ids"),
    ("/v1/completions", {"prompt": [1, 2, 10**9]}, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 2**63 - 1]}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 1e30},
     "repetition_penalty"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "seed": -2**63 - 1}, "seed"),
])
def test_sampling_fields_and_token_ids_out_of_range_are_400s(llm_http, route, body, param):
    resp = llm_http.post(route, json={**body, "max_tokens": 2})
    assert_refused(resp, param)
    assert llm_http.get("/health").status_code == 200
    assert llm_http.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}).status_code == 200


def test_a_prompt_too_long_for_max_model_len_is_refused_by_its_length_before_tokenizing(llm_http):
    [model] = llm_http.get("/v1/models").json()["data"]
    prompt = "a" * (model["max_model_len"] * 64 + 1)  # more than any tiny-vocabulary token spells
    for body, route, param in (({"prompt": prompt}, "/v1/completions", "prompt"),
                               ({"messages": [{"role": "user", "content": prompt}]}, "/v1/chat/completions",
                                "messages")):
        resp = llm_http.post(route, json={**body, "max_tokens": 2})
        assert_refused(resp, param)
        assert "characters" in resp.json()["error"]["message"]  # the length bound, not the token count


def test_a_text_only_model_refuses_media_parts_naming_them(llm_http):
    url = "data:image/png;base64,iVBORw0KGgo="
    for part, kind in (({"type": "image_url", "image_url": {"url": url}}, "image"),
                       ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "audio")):
        resp = llm_http.post("/v1/chat/completions", json={"max_tokens": 2, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]})
        assert_refused(resp, "messages[0].content[1]")
        assert resp.json()["error"]["code"] == "unsupported_modality" and kind in resp.json()["error"]["message"]


@pytest.fixture(scope="module")
def video_http(zoo):
    with serve(zoo("wan-t2v")) as http:
        yield http


@pytest.mark.parametrize("value", [9223372036854775808, 10**30, 10**12, 513])
def test_the_panic_request_through_wans_extra_params_is_a_400(video_http, value):
    form = {"prompt": "a cat", "size": "32x32", "num_frames": "5", "num_inference_steps": "1",
            "extra_params": '{"max_sequence_length": %d}' % value}
    for route in ("/v1/videos", "/v1/videos/sync"):  # a job is checked as the stage would before it is queued
        resp = video_http.post(route, data=form)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] in ("extra_params", "max_sequence_length")
    assert video_http.get("/health").status_code == 200
    ok = video_http.post("/v1/videos/sync", data={**form, "extra_params": '{"max_sequence_length": 16}'})
    assert ok.status_code == 200, ok.text
