"""The text surface over the fake engine: finish reasons, usage, n fan-out, tool parsing,
completions' edge checks. The same fields on a real model are in tests/e2e/test_openai_text_e2e.py."""

from __future__ import annotations

import openai
import pytest

from omnistage.entrypoints.openai.chat.serving import ContentGate
from omnistage.entrypoints.openai.chat.tools import HermesToolParser, parser_for, required_calls_schema

MESSAGES = [{"role": "user", "content": "hi"}]
MODEL = None  # the served one (the openai client needs the argument)


def _client(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


def test_an_aborted_request_says_abort_and_usage_counts_the_prompt(app_client):
    http, engine = app_client("text")
    engine.finish_reason = "abort"
    client = _client(http)
    reply = client.chat.completions.create(messages=MESSAGES, model=MODEL)
    assert reply.choices[0].finish_reason == "abort"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (7, 5, 12)
    chunks = list(client.chat.completions.create(messages=MESSAGES, model=MODEL, stream=True, stream_options={"include_usage": True}))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "abort"
    assert chunks[-1].usage.prompt_tokens == 7
    assert client.completions.create(prompt="hi", model=MODEL).choices[0].finish_reason == "abort"


def test_n_is_n_engine_requests_with_derived_seeds(app_client):
    http, engine = app_client("text")
    reply = _client(http).chat.completions.create(messages=MESSAGES, model=MODEL, n=3, seed=10)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [p.seed for _, p, _ in engine.requests] == [10, 11, 12]
    assert len({rid for _, _, rid in engine.requests}) == 3
    assert reply.usage.prompt_tokens == 7 and reply.usage.completion_tokens == 15  # the prompt counts once


def test_completions_prompt_lists_echo_and_refused_fields(app_client):
    http, engine = app_client("omni")
    client = _client(http)
    result = client.completions.create(model=MODEL, prompt=["a", "b"], n=2, echo=True, max_tokens=2)
    assert [c.text for c in result.choices] == ["aHello from", "aHello from", "bHello from", "bHello from"]
    assert engine.modalities[-1] == ("text",)  # an omni model answers with its thinker alone
    assert result.usage.prompt_tokens == 14
    client.completions.create(model=MODEL, prompt=[1, 2, 3])
    assert engine.requests[-1][0] == {"prompt_token_ids": [1, 2, 3]}
    for body, param in (({"prompt": "x", "suffix": "y"}, "suffix"), ({"prompt": "x", "n": 2, "best_of": 1}, "best_of"),
                        ({"prompt": "x", "best_of": 2, "stream": True}, "best_of"),
                        ({"prompt": [1, 2], "echo": True}, "echo"), ({"prompt": "x", "logprobs": 9}, "logprobs"),
                        ({"prompt": "x", "n": 99}, "n"), ({"prompt": []}, "prompt"),
                        ({"prompt": "x", "guided_regex": "a", "structured_outputs": {"regex": "b"}},
                         "structured_outputs")):
        resp = http.post("/v1/completions", json=body)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
    resp = http.post("/v1/completions", json={"prompt": "x"})
    assert resp.status_code == 200
    http2, _ = app_client("image")
    resp = http2.post("/v1/completions", json={"prompt": "x"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "unsupported_route"


def test_hermes_parser_finds_calls_and_keeps_the_rest():
    parser = parser_for("qwen2")
    content, calls = parser.parse('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
                                  '\n</tool_call>\n<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert content == "Let me check."
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Oslo"}'), ("f", "{}")]
    assert parser.parse("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])
    assert isinstance(parser_for("some_new_family"), HermesToolParser)


def test_content_gate_holds_back_a_possible_marker():
    gate = ContentGate("<tool_call>", True)
    assert gate.feed("Hi <tool") == "Hi "
    assert gate.feed("_ca") == ""
    assert gate.feed("ll>{") == ""
    gate = ContentGate("<tool_call>", True)
    assert gate.feed("a <to") == "a " and gate.feed("day") == "<today"
    assert gate.rest("a <today and more") == " and more"


def test_required_schema_allows_one_call_unless_parallel():
    tools = [{"function": {"name": "f", "parameters": {"type": "object"}}}]
    assert required_calls_schema(tools, parallel=False)["maxItems"] == 1
    assert "maxItems" not in required_calls_schema(tools, parallel=True)


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function",
                                                                                   "function": {"name": "g"}}},
     "tool_choice.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"top_k": -5}, "top_k"),
    ({"tempreature": 1}, "tempreature"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"guided_json": 5}, "structured_outputs.json"),
    ({"min_tokens": 2, "response_format": {"type": "json_object"}}, "min_tokens"),
    ({"parallel_tool_calls": "maybe"}, "parallel_tool_calls"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nope"}}}],
      "tool_choice": "required"}, "tools"),
    ({"structured_outputs": {"regex": "(("}}, "structured_outputs.regex"),
])
def test_tool_and_format_errors_name_the_field(app_client, body, param):
    http, engine = app_client("text")
    resp = http.post("/v1/chat/completions", json={"messages": MESSAGES, **body})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
    assert engine.requests == []


CALL_TEXT = ["Checking.", " <tool", "_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Oslo\"}}",
             "\n</tool_call>"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def test_auto_tool_calls_are_parsed_whole_and_streamed(app_client):
    http, engine = app_client("text")
    engine.text = CALL_TEXT
    client = _client(http)
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    [call] = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Oslo"}')
    assert engine.requests[-1][0]["tools"] == TOOLS  # the template gets them

    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, stream=True))
    content = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    assert content == "Checking. "  # nothing of the call leaks into the content
    [delta] = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert delta.index == 0 and delta.function.name == "get_weather" and delta.id.startswith("call_")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    none = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="none")
    assert none.choices[0].message.tool_calls is None and "<tool_call>" in none.choices[0].message.content
    assert "tools" not in engine.requests[-1][0]


def test_tool_messages_reach_the_template_with_parsed_arguments(app_client):
    http, engine = app_client("text")
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    _client(http).chat.completions.create(model=MODEL, tools=TOOLS, messages=MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    messages = engine.requests[-1][0]["messages"]
    assert messages[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}


def test_the_body_user_is_the_session_that_affinity_routing_keeps_together(app_client):
    http, engine = app_client("text")
    client = _client(http)
    client.chat.completions.create(messages=MESSAGES, model=MODEL, user="alice")
    list(client.chat.completions.create(messages=MESSAGES, model=MODEL, user="bob", stream=True))
    client.completions.create(prompt="hi", model=MODEL, user="carol")
    http.post("/v1/responses", json={"model": MODEL, "input": "hi", "user": "dave"})
    client.chat.completions.create(messages=MESSAGES, model=MODEL)
    assert engine.session_ids == ["alice", "bob", "carol", "dave", None]
    images, image_engine = app_client("image")
    assert images.post("/v1/images/generations", json={"prompt": "x", "user": "erin"}).status_code == 200
    assert image_engine.session_ids == ["erin"]
