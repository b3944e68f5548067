"""JSON the server refuses with a 400 naming where it sits: NaN/Infinity, floats that
overflow, integers beyond int64, lone surrogates, nesting past the depth limit, in bodies,
in JSON-valued form fields and in WebSocket messages. Large bodies are parsed off the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from omnistage.entrypoints.openai import json_body


def post_raw(http, path, text):
    return http.post(path, content=text.encode("utf-8", "surrogatepass"),
                     headers={"content-type": "application/json"})


def assert_400(resp, param):
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.json()


@pytest.mark.parametrize("text, param", [
    ('{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', None),
    ('{"messages": [{"role": "user", "content": "hi"}], "temperature": -Infinity}', None),
    ('{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}', "temperature"),
    ('{"messages": [{"role": "user", "content": "hi"}], "seed": 18446744073709551616}', "seed"),
    ('{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
    ('{"messages": [{"role": "user", "content": "hi"}], "metadata": ' + "[" * 3000 + "]" * 3000 + "}", None),
    ('{"messages": [{"role": "user", "content": "hi"}], "metadata": ' + "[" * 100 + "]" * 100 + "}",
     "metadata" + "[0]" * 63),
])
def test_chat_bodies_out_of_json_bounds_are_400s(app_client, text, param):
    http, engine = app_client("text")
    resp = post_raw(http, "/v1/chat/completions", text)
    assert_400(resp, param)
    assert resp.json()["error"]["code"] == "invalid_json"
    assert not engine.requests
    assert http.get("/health").status_code == 200


def test_every_route_group_reads_its_body_through_the_bounds(app_client):
    """A router built without JSONBodyRoute would parse NaN and deep nesting unchecked."""
    import importlib
    import pkgutil

    import omnistage.entrypoints.openai as openai_pkg

    groups = [m.name for m in pkgutil.iter_modules(openai_pkg.__path__) if m.ispkg]
    routers = {g: importlib.import_module(f"{openai_pkg.__name__}.{g}.api_router").router
               for g in groups if importlib.util.find_spec(f"{openai_pkg.__name__}.{g}.api_router")}
    assert "responses" in routers and "chat" in routers
    assert not [g for g, r in routers.items() if r.route_class is not json_body.JSONBodyRoute]
    http, engine = app_client("text")
    resp = post_raw(http, "/v1/responses", '{"input": "hi", "temperature": NaN}')
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json", resp.text
    assert not engine.requests


def test_completions_prompt_token_ids_beyond_int64_are_a_400(app_client):
    http, _ = app_client("text")
    resp = post_raw(http, "/v1/completions", '{"prompt": [1, 2, 9223372036854775808]}')
    assert_400(resp, "prompt[2]")


def test_json_in_form_fields_is_bounded_too(app_client):
    http, engine = app_client("video")
    deep = "[" * 3000 + "]" * 3000
    resp = http.post("/v1/videos", data={"prompt": "x", "extra_params": '{"a": ' + deep + "}"})
    assert_400(resp, "extra_params")
    resp = http.post("/v1/videos", data={"prompt": "x", "extra_params": '{"max_sequence_length": 1e999}'})
    assert_400(resp, "extra_params")
    image, _ = app_client("image")
    resp = image.post("/v1/images/edits", data={"prompt": "x", "max_sequence_length": deep},
                      files={"image": ("a.png", b"\x89PNG", "image/png")})
    assert_400(resp, "max_sequence_length")
    assert not engine.requests


def test_a_large_body_is_parsed_off_the_event_loop(monkeypatch):
    threads = []
    parse = json_body.loads

    def spy(text, param=None):
        threads.append(threading.get_ident())
        return parse(text, param)

    monkeypatch.setattr(json_body, "loads", spy)
    small = b'{"a": 1}'
    large = b'{"a": "' + b"x" * (json_body.OFF_LOOP_BYTES + 1) + b'"}'

    async def main():
        loop_thread = threading.get_ident()
        assert (await json_body.parse_body(small)) == {"a": 1}
        assert len((await json_body.parse_body(large))["a"]) == json_body.OFF_LOOP_BYTES + 1
        return loop_thread

    loop_thread = asyncio.run(main())
    assert threads[0] == loop_thread and threads[1] != loop_thread


def test_check_walks_without_recursion():
    value: list = []
    for _ in range(100_000):  # built directly: json.loads itself would refuse it by recursion
        value = [value]
    with pytest.raises(json_body.BadJSON) as e:
        json_body.check(value, "x")
    assert "nested deeper" in e.value.message
