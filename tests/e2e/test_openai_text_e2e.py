"""The LLM surface of `omnistage serve` on the zoo's random qwen2-llm, through the official
client: usage, n, seeds, logprobs, completions, structured outputs and tools.

One server for the module (a start costs ~10-20 s here). Random weights say nothing
useful, so the checks are on shapes, counts, reproducibility and grammar: a schema'd
answer must parse and validate every time.
"""

from __future__ import annotations

import json

import openai
import pytest
from remote_server import RemoteServer

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Say hello"}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 5}, "age": {"type": "integer", "minimum": 0,
                                                                        "maximum": 99}},
    "required": ["name", "age"], "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]}, "days": {"type": "integer", "minimum": 1,
                                                                                  "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}


@pytest.fixture(scope="module")
def server(zoo):
    with RemoteServer(zoo("qwen2-llm"), "--served-model-name", "llm",
                      "--stage-overrides", '{"0": {"max_model_len": 1024}}', in_process=True) as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return server.client()


def test_models_list_the_context_length_and_modalities(client, server):
    [model] = client.models.list().data
    assert model.id == "llm"
    card = server.http().get("/v1/models").json()["data"][0]
    assert card["max_model_len"] == 1024  # the deploy value over the checkpoint's 2048
    assert card["modalities"] == {"input": ["text"], "output": ["text"]}
    assert "POST /v1/completions" in card["routes"]
    doc = server.http().get("/openapi.json").json()
    completions = doc["paths"]["/v1/completions"]["post"]["responses"]
    assert "text/event-stream" in completions["200"]["content"] and "422" not in completions
    assert {"400", "401", "404", "413", "415", "429", "500", "503"} <= set(completions)


def test_usage_counts_the_prompt_and_n_samples_are_seeded(client):
    reply = client.chat.completions.create(model="llm", messages=MESSAGES, max_tokens=6, n=3, seed=7,
                                           temperature=1.0)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    assert len(set(texts)) > 1  # independent samples
    assert reply.usage.prompt_tokens > 0
    assert 3 <= reply.usage.completion_tokens <= 18  # summed over the choices
    again = client.chat.completions.create(model="llm", messages=MESSAGES, max_tokens=6, n=3, seed=7, temperature=1.0)
    assert [c.message.content for c in again.choices] == texts  # the seed makes all n reproducible
    longer = client.chat.completions.create(model="llm", messages=MESSAGES + [{"role": "user", "content": "again"}],
                                            max_tokens=1)
    assert longer.usage.prompt_tokens > reply.usage.prompt_tokens

    chunks = list(client.chat.completions.create(model="llm", messages=MESSAGES, max_tokens=4, n=2, seed=1,
                                                 stream=True, stream_options={"include_usage": True}))
    by_choice = {0: "", 1: ""}
    for c in chunks:
        for choice in c.choices:
            by_choice[choice.index] += choice.delta.content or ""
    assert chunks[-1].usage.prompt_tokens == reply.usage.prompt_tokens
    assert 2 <= chunks[-1].usage.completion_tokens <= 8
    finishes = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert len(finishes) == 2 and set(finishes) <= {"stop", "length"}


def test_chat_logprobs_plain_and_streamed(client):
    reply = client.chat.completions.create(model="llm", messages=MESSAGES, max_tokens=5, temperature=0,
                                           logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy picks the most likely
        assert entry.bytes == list(entry.token.encode())
    chunks = list(client.chat.completions.create(model="llm", messages=MESSAGES, max_tokens=5, temperature=0,
                                                 logprobs=True, top_logprobs=3, stream=True))
    streamed = [e for c in chunks for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in content]


def test_completions(client, server):
    # prompts whose 4 greedy steps have top-2 alternatives of different text on the zoo model: OpenAI's
    # top_logprobs is a dict by text, so two byte tokens that both decode to "" would count once
    result = client.completions.create(model="llm", prompt=["The sun", "A photo of"], max_tokens=4,
                                       temperature=0, logprobs=2)
    assert len(result.choices) == 2 and result.usage.prompt_tokens > 0
    for choice in result.choices:
        lp = choice.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) <= 4
        assert lp.text_offset[0] == 0 and all(t <= 0 for t in lp.token_logprobs)
        assert all(len(top) == 2 for top in lp.top_logprobs)
    tokens = client.completions.create(model="llm", prompt=[[10, 20, 30]], max_tokens=3, temperature=0)
    assert tokens.usage.prompt_tokens == 3
    echoed = client.completions.create(model="llm", prompt="The sun", max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == "The sun" + result.choices[0].text
    chunks = list(client.completions.create(model="llm", prompt="The sun", max_tokens=4, temperature=0,
                                            stream=True, stream_options={"include_usage": True}, logprobs=2))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == result.choices[0].text
    streamed = [(c.choices[0].logprobs.tokens, c.choices[0].logprobs.text_offset) for c in chunks
                if c.choices and c.choices[0].logprobs]
    assert [t for tokens, _ in streamed for t in tokens] == result.choices[0].logprobs.tokens
    assert [o for _, offsets in streamed for o in offsets] == result.choices[0].logprobs.text_offset
    assert chunks[-1].usage.completion_tokens == echoed.usage.completion_tokens
    text = result.choices[0].text
    if len(text) >= 3:  # greedy: the same text, cut before the stop string
        stop = text[1:3]
        stopped = client.completions.create(model="llm", prompt="The sun", max_tokens=8, temperature=0, stop=stop)
        assert stopped.choices[0].text == text[:text.find(stop)] and stopped.choices[0].finish_reason == "stop"
    many = client.completions.create(model="llm", prompt="Hello world", max_tokens=5, n=3, seed=4, temperature=1.0,
                                     logprobs=0)
    best = client.completions.create(model="llm", prompt="Hello world", max_tokens=5, best_of=3, seed=4,
                                     temperature=1.0)
    scores = [sum(c.logprobs.token_logprobs) for c in many.choices]
    assert len(set(c.text for c in many.choices)) > 1
    assert best.choices[0].text == many.choices[scores.index(max(scores))].text and best.choices[0].logprobs is None
    assert best.usage.completion_tokens == many.usage.completion_tokens  # every sample counts
    with pytest.raises(openai.BadRequestError, match="suffix"):
        client.completions.create(model="llm", prompt="x", suffix="y")


def test_structured_outputs_always_validate(client):
    for seed in range(2):
        reply = client.chat.completions.create(
            model="llm", messages=MESSAGES, max_tokens=60, seed=seed, temperature=1.0,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                                    "strict": True}})
        value = json.loads(reply.choices[0].message.content)
        assert set(value) == {"name", "age"} and len(value["name"]) <= 5 and 0 <= value["age"] <= 99
    reply = client.chat.completions.create(model="llm", messages=MESSAGES, max_tokens=16, seed=0,
                                           response_format={"type": "json_object"})
    assert reply.choices[0].message.content.startswith("{")
    choice = client.completions.create(model="llm", prompt="Pick", max_tokens=10,
                                       extra_body={"structured_outputs": {"choice": ["red", "green"]}})
    assert choice.choices[0].text in ("red", "green")
    regex = client.completions.create(model="llm", prompt="Pick", max_tokens=10, extra_body={"guided_regex": "[0-9]{4}"})
    assert regex.choices[0].text.isdigit() and len(regex.choices[0].text) == 4
    with pytest.raises(openai.BadRequestError, match="structured_outputs.regex"):
        client.completions.create(model="llm", prompt="x", extra_body={"guided_regex": "(("})


def test_tools_forced_calls_parse_and_tool_messages_go_back(client):
    tools = [WEATHER, TIME]
    named = client.chat.completions.create(model="llm", messages=MESSAGES, tools=tools, max_tokens=40, seed=1,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = named.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and args["city"] in ("Oslo", "Lima") and 1 <= args["days"] <= 7

    required = client.chat.completions.create(model="llm", messages=MESSAGES, tools=tools, max_tokens=80, seed=2,
                                              tool_choice="required", parallel_tool_calls=False)
    [call] = required.choices[0].message.tool_calls
    assert call.function.name in ("get_weather", "get_time") and json.loads(call.function.arguments)

    chunks = list(client.chat.completions.create(model="llm", messages=MESSAGES, tools=tools, max_tokens=80, seed=2,
                                                 tool_choice="required", parallel_tool_calls=False, stream=True))
    streamed = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert [(t.function.name, t.function.arguments) for t in streamed] == [(call.function.name,
                                                                           call.function.arguments)]
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["tool_calls"]

    # The template gets the tools (a longer prompt) unless tool_choice is "none"; the call
    # and the tool's answer go back into it.
    plain = client.chat.completions.create(model="llm", messages=MESSAGES, max_tokens=1)
    auto = client.chat.completions.create(model="llm", messages=MESSAGES, tools=tools, max_tokens=1)
    none = client.chat.completions.create(model="llm", messages=MESSAGES, tools=tools, tool_choice="none",
                                          max_tokens=1)
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens == none.usage.prompt_tokens
    history = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                          {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    answer = client.chat.completions.create(model="llm", messages=history, tools=tools, max_tokens=4)
    assert answer.usage.prompt_tokens > auto.usage.prompt_tokens


def test_bad_values_are_400s_naming_the_field(server):
    http = server.http()
    for body, param in (({"n": 0}, "n"), ({"top_logprobs": 30, "logprobs": True}, "top_logprobs"),
                        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
                         "response_format.json_schema"),
                        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                         "tool_choice.function.name")):
        resp = http.post("/v1/chat/completions", json={"messages": MESSAGES, **body})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
