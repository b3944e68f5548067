"""The Responses API over fake text, omni and image engines, through the official openai
client: bodies and streamed events parse as its Responses types, and what reaches the
engine is what the chat route would send."""

from __future__ import annotations

import base64
import io
import json
import time

import openai
import pytest
from fake_engine import make_client
from openai.types.responses import Response
from PIL import Image
from pydantic import BaseModel

from omnistage.media.image import image_to_data_url

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL_TEXT = ["Let me look. ", '<tool_call>{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}</tool_call>']


def _client(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


def test_plain_and_streamed_text(app_client):
    http, engine = app_client("text")
    client = _client(http)
    engine.finish_reason = "length"  # the engine's reason when max_tokens cut the answer
    reply = client.responses.create(model="fake-text", input="hi", instructions="be brief", max_output_tokens=3,
                                    temperature=0, metadata={"k": "v"}, prompt_cache_key="conv-1",
                                    extra_body={"top_k": 5})
    Response.model_validate(http.get(f"/v1/responses/{reply.id}").json())  # strict, not just constructed
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output_text == "Hello from the"
    assert reply.usage.input_tokens == 7 and reply.usage.output_tokens == 5 and reply.usage.total_tokens == 12
    assert reply.metadata == {"k": "v"} and reply.prompt_cache_key == "conv-1" and reply.instructions == "be brief"
    prompt, params, _ = engine.requests[-1]
    assert prompt == {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
    assert (params.max_tokens, params.temperature, params.top_k) == (3, 0, 5)
    assert engine.modalities[-1] == ("text",)

    engine.finish_reason = "stop"
    events = list(client.responses.create(model="fake-text", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello from the fake model."
    final = events[-1].response
    assert final.status == "completed" and final.output_text == "Hello from the fake model."
    assert final.output[0].id == events[2].item.id
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_function_call_round_trip_plain_and_streamed(app_client):
    http, engine = app_client("text")
    client = _client(http)
    engine.text = list(CALL_TEXT)
    reply = client.responses.create(model="fake-text", input="weather in Oslo?", tools=[WEATHER])
    message, call = reply.output
    assert message.content[0].text == "Let me look."
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments) == {
        "city": "Oslo"}
    assert engine.requests[-1][0]["tools"] == [{"type": "function", "function": {
        k: v for k, v in WEATHER.items() if k != "type"}}]

    engine.text = ["It is sunny."]
    follow = client.responses.create(model="fake-text", previous_response_id=reply.id, tools=[WEATHER], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'}])
    assert follow.output_text == "It is sunny."
    messages = engine.requests[-1][0]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == "Let me look."
    assert messages[1]["tool_calls"] == [{"id": call.call_id, "type": "function",
                                          "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]
    assert messages[2] == {"role": "tool", "tool_call_id": call.call_id, "content": '{"sky": "sunny"}'}

    engine.text = list(CALL_TEXT)
    events = list(client.responses.create(model="fake-text", input="weather?", tools=[WEATHER], stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Let me look. "  # up to the call's marker; the call is never streamed as text
    [args] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(args.arguments) == {"city": "Oslo"} and args.name == "get_weather"
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["message", "function_call"]
    assert [i.type for i in events[-1].response.output] == ["message", "function_call"]


def test_forced_call_and_structured_output_become_grammars(app_client):
    http, engine = app_client("text")
    client = _client(http)
    engine.text = ['{"city": ', '"Lima"}']
    reply = client.responses.create(model="fake-text", input="x", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"})
    [call] = reply.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Lima"}
    assert engine.requests[-1][1].structured_outputs.json == WEATHER["parameters"]

    class Person(BaseModel):
        name: str
        age: int

    engine.text = ['{"name": "Al", ', '"age": 3}']
    parsed = client.responses.parse(model="fake-text", input="who?", text_format=Person)
    assert parsed.output_parsed == Person(name="Al", age=3)
    schema = engine.requests[-1][1].structured_outputs.json
    assert schema["properties"].keys() == {"name", "age"} and schema["required"] == ["name", "age"]
    client.responses.create(model="fake-text", input="x", text={"format": {"type": "json_object"}})
    assert engine.requests[-1][1].structured_outputs.json_object


def test_stored_responses_continue_list_and_delete(app_client):
    http, engine = app_client("text", max_stored_responses=3)
    client = _client(http)
    first = client.responses.create(model="fake-text", input="one", instructions="first only")
    second = client.responses.create(model="fake-text", previous_response_id=first.id, input=[
        {"role": "user", "content": "two"}, {"type": "message", "role": "user", "content": "three"}])
    assert second.previous_response_id == first.id
    assert engine.requests[-1][0]["messages"] == [  # instructions are not carried over (as OpenAI)
        {"role": "user", "content": "one"}, {"role": "assistant", "content": "Hello from the fake model."},
        {"role": "user", "content": "two"}, {"role": "user", "content": "three"}]
    items = client.responses.input_items.list(second.id)
    assert [i.content[0].text for i in items.data] == ["three", "two"]  # newest first, as OpenAI
    page = client.responses.input_items.list(second.id, order="asc", limit=1)
    assert [i.content[0].text for i in page.data] == ["two"] and page.has_more
    rest = client.responses.input_items.list(second.id, order="asc", after=page.data[0].id)
    assert [i.content[0].text for i in rest.data] == ["three"] and not rest.has_more

    client.responses.delete(second.id)
    for call in (lambda: client.responses.retrieve(second.id),
                 lambda: client.responses.create(input="x", previous_response_id=second.id)):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.body["code"] == "response_not_found"
    assert http.post("/v1/responses", json={"input": "x", "previous_response_id": "resp_nope"}).json()[
        "error"]["param"] == "previous_response_id"

    unstored = client.responses.create(input="x", store=False)
    assert http.get(f"/v1/responses/{unstored.id}").status_code == 404
    ids = [client.responses.create(input=str(i)).id for i in range(3)]  # the cap is 3: `first` goes
    assert http.get(f"/v1/responses/{first.id}").status_code == 404
    assert all(http.get(f"/v1/responses/{i}").status_code == 200 for i in ids)


def test_stored_responses_survive_a_restart_and_expire(tmp_path):
    http, engine = make_client("text", files_dir=str(tmp_path))
    with http:
        first = _client(http).responses.create(input="one")
    assert (tmp_path / "responses" / "responses.sqlite3").is_file()
    http, engine = make_client("text", files_dir=str(tmp_path))
    with http:
        _client(http).responses.create(input="two", previous_response_id=first.id)
        assert [m["content"] for m in engine.requests[-1][0]["messages"]] == [
            "one", "Hello from the fake model.", "two"]
    http, _ = make_client("text", files_dir=str(tmp_path), response_ttl_s=0.2)
    with http:
        time.sleep(0.3)
        assert http.get(f"/v1/responses/{first.id}").status_code == 404


def test_background_response_polls_and_cancels(app_client):
    http, engine = app_client("text", step_delay=0.05)
    client = _client(http)
    queued = client.responses.create(input="x", background=True)
    assert queued.status == "queued"
    deadline = time.time() + 10
    while client.responses.retrieve(queued.id).status in ("queued", "in_progress") and time.time() < deadline:
        time.sleep(0.05)
    assert client.responses.retrieve(queued.id).output_text == "Hello from the fake model."
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(queued.id)  # completed already

    engine.step_delay = 5
    slow = client.responses.create(input="x", background=True)
    time.sleep(0.2)
    assert client.responses.cancel(slow.id).status == "cancelled"
    assert engine.aborted[-1] == slow.id  # the engine request is stopped, not left running


@pytest.mark.parametrize("body, param", [
    ({"input": [{"role": "user", "content": "a"}, {"role": "user", "content": [
        {"type": "input_text", "text": "b"}, {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]},
     "input[1].content[1].image_url"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
     "input[0].content[0].file_id"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "bogus"}}}},
     "text.format.schema"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "max_tokens": 5}, "max_tokens"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "top_k": -2}, "top_k"),
    ({"input": [{"type": "web_search_call", "id": "w"}]}, "input[0]"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "x", "background": True, "stream": True}, "background"),
    ({"input": "x", "background": True, "store": False}, "background"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "size": "64x64"}, "size"),
    ({"input": "x", "modalities": ["audio"]}, None),
    ({"input": []}, "input"),
])
def test_bad_input_is_a_400_naming_the_field(app_client, body, param):
    http, _ = app_client("text")
    answer = http.post("/v1/responses", json=body)
    assert answer.status_code == 400, answer.json()
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] is not None and error["param"].startswith(param), error


def test_omni_answers_with_audio_and_takes_image_input(app_client):
    http, engine = app_client("omni")
    client = _client(http)
    image = image_to_data_url(Image.new("RGB", (8, 8), (1, 2, 3)))
    reply = client.responses.create(input=[{"role": "user", "content": [
        {"type": "input_text", "text": "what is it?"}, {"type": "input_image", "image_url": image}]}],
        extra_body={"modalities": ["text", "audio"], "audio": {"format": "wav", "voice": "Chelsie"}})
    parts = [p.type for p in reply.output[0].content]
    assert parts == ["output_text", "output_audio"]
    audio = http.get(f"/v1/responses/{reply.id}").json()["output"][0]["content"][1]
    assert base64.b64decode(audio["data"])[:4] == b"RIFF" and audio["transcript"] == "Hello from the fake model."
    prompt = engine.requests[-1][0]
    assert prompt["voice"] == "Chelsie" and prompt["messages"][0]["content"][1]["image"].size == (8, 8)
    assert engine.modalities[-1] == ("text", "audio")

    text_only = client.responses.create(input="hi")
    assert [p.type for p in text_only.output[0].content] == ["output_text"] and engine.modalities[-1] == ("text",)

    events = list(client.responses.create(input="hi", stream=True, extra_body={
        "modalities": ["text", "audio"], "audio": {"format": "pcm16"}}))
    pcm = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.audio.delta")
    assert len(pcm) == 2 * 3 * 800 * 24000 // 16000  # three 800-sample chunks at 16 kHz, as 24 kHz pcm16
    assert events[-1].type == "response.completed"


def test_image_model_answers_with_an_image_generation_item(app_client):
    http, engine = app_client("image")
    client = _client(http)
    reply = client.responses.create(input="a red fox", extra_body={"size": "32x16", "num_inference_steps": 2})
    [item] = reply.output
    assert item.type == "image_generation_call" and item.status == "completed"
    assert Image.open(io.BytesIO(base64.b64decode(item.result))).size == (32, 16)
    _, params, _ = engine.requests[-1]
    assert (params.width, params.height, params.num_inference_steps) == (32, 16, 2)
    events = list(client.responses.create(input="a red fox", stream=True))
    assert [e.type for e in events][-3:] == ["response.output_item.added", "response.output_item.done",
                                            "response.completed"]
    bad = http.post("/v1/responses", json={"input": "x", "max_output_tokens": 5}).json()["error"]
    assert bad["param"] == "max_output_tokens"


def test_engine_failure_in_a_stream_is_an_error_then_response_failed(app_client):
    http, engine = app_client("text")

    async def failing(prompt, params=None, request_id=None, modalities=None, session_id=None):
        from omnistage.engine.outputs import OmniOutput

        yield OmniOutput(request_id, text="Hel", text_delta="Hel")
        yield OmniOutput(request_id, finished=True, finish_reason="error", error="stage 0 (llm): engine step raised")

    engine.generate = failing
    events = list(_client(http).responses.create(input="x", stream=True))
    kinds = [e.type for e in events]
    assert kinds[-2:] == ["error", "response.failed"], kinds
    assert "engine step raised" in events[-1].response.error.message
    assert _client(http).responses.retrieve(events[-1].response.id).status == "failed"
    assert http.app.state.gateway.num_admitted == 0


def test_shutdown_fails_a_running_background_response(tmp_path):
    http, engine = make_client("text", files_dir=str(tmp_path), step_delay=5)
    with http:
        running = _client(http).responses.create(input="x", background=True)
        time.sleep(0.2)
    http, _ = make_client("text", files_dir=str(tmp_path))
    with http:
        again = _client(http).responses.retrieve(running.id)
    assert again.status == "failed" and "server stopped" in again.error.message
