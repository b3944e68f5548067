"""`POST /v1/responses` of `omnistage serve` on the zoo's random qwen2-llm, through the
official client: the same answer as chat completions for the same seed (one path), a
schema'd answer that validates every time, a forced function call round trip, and a
conversation continued across a server restart (responses stored under --output-dir).

One server for the module, restarted once by the last test. Both serve from a thread of the
test process (`in_process=True`): the restarted one is a new app and engine that knows the
first one's responses only through what it stored on disk.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import BaseModel, Field
from remote_server import RemoteServer

pytestmark = pytest.mark.e2e

MODEL = "llm"
ARGS = ("--served-model-name", MODEL, "--stage-overrides", '{"0": {"max_model_len": 1024}}')
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]}, "days": {"type": "integer", "minimum": 1,
                                                                                 "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}


class Person(BaseModel):
    name: str = Field(max_length=5)
    age: int = Field(ge=0, le=99)


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("responses")


@pytest.fixture(scope="module")
def server(zoo, output_dir):
    with RemoteServer(zoo("qwen2-llm"), *ARGS, "--output-dir", str(output_dir), in_process=True) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def test_same_answer_as_chat_completions_plain_and_streamed(client):
    sampling = {"max_output_tokens": 8, "temperature": 1.0, "extra_body": {"seed": 11}}
    reply = client.responses.create(model=MODEL, input="Say hello", instructions="Be brief.", **sampling)
    chat = client.chat.completions.create(model=MODEL, max_tokens=8, temperature=1.0, seed=11, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}])
    assert reply.output_text == chat.choices[0].message.content  # one chat path under both routes
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    assert reply.usage.output_tokens == chat.usage.completion_tokens
    assert (reply.status == "incomplete") == (chat.choices[0].finish_reason == "length")

    events = list(client.responses.create(model=MODEL, input="Say hello", instructions="Be brief.", stream=True,
                                          **sampling))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == reply.output_text == events[-1].response.output_text
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.usage.output_tokens == reply.usage.output_tokens


def test_structured_output_is_valid_against_its_schema(client):
    for seed in range(3):
        parsed = client.responses.parse(model=MODEL, input="A person", text_format=Person, max_output_tokens=60,
                                        temperature=1.0, extra_body={"seed": seed})
        assert isinstance(parsed.output_parsed, Person), parsed.output_text
    reply = client.responses.create(model=MODEL, input="JSON please", max_output_tokens=16, extra_body={"seed": 0},
                                    text={"format": {"type": "json_object"}})
    assert reply.output_text.startswith("{")  # random weights rarely close the object within 16 tokens
    if reply.status == "completed":
        assert isinstance(json.loads(reply.output_text), dict)


def test_function_call_round_trip(client):
    call_reply = client.responses.create(model=MODEL, input="Weather in Oslo this week?", tools=[WEATHER],
                                         tool_choice={"type": "function", "name": "get_weather"},
                                         max_output_tokens=60)
    [call] = call_reply.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    answer = client.responses.create(model=MODEL, previous_response_id=call_reply.id, tools=[WEATHER],
                                     max_output_tokens=4, input=[{"type": "function_call_output",
                                                                  "call_id": call.call_id, "output": "sunny"}])
    assert answer.status in ("completed", "incomplete") and answer.output[0].type == "message"
    assert answer.usage.input_tokens > call_reply.usage.input_tokens  # the call and its result are in the prompt
    # The first turn's prompt (template and tools, user message) came from the prefix cache.
    assert 0 < answer.usage.input_tokens_details.cached_tokens <= call_reply.usage.input_tokens


def test_previous_response_id_across_a_server_restart(zoo, server, client, output_dir):
    first = client.responses.create(model=MODEL, input="Remember the word kiwi.", max_output_tokens=4)
    again = client.responses.create(model=MODEL, input="Remember the word kiwi.", max_output_tokens=4,
                                    store=False)
    server.stop()
    with RemoteServer(zoo("qwen2-llm"), *ARGS, "--output-dir", str(output_dir), in_process=True) as restarted:
        client = restarted.client()
        assert client.responses.retrieve(first.id).output_text == first.output_text
        follow = client.responses.create(model=MODEL, previous_response_id=first.id, input="Which word?",
                                         max_output_tokens=4)
        assert follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
        assert restarted.http().get(f"/v1/responses/{again.id}").status_code == 404  # store: false
