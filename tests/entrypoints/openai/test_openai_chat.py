"""Chat completions over fake text, omni (text + audio) and image engines, through the
official openai client."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import openai
import pytest
import soundfile as sf
from PIL import Image

from omnistage.ar.sampling_params import SamplingParams
from omnistage.media.image import image_to_data_url


def _client(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


def _wav(seconds=0.1, rate=16000) -> str:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(seconds * rate), dtype=np.float32), rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def test_text_chat_plain_and_streamed(app_client):
    http, engine = app_client("text")
    client = _client(http)
    reply = client.chat.completions.create(model="fake-text", messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_tokens=3, temperature=0, extra_body={"top_k": 5})
    assert reply.choices[0].message.content == "Hello from the"
    assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens == 5
    prompt, params, _ = engine.requests[-1]
    assert prompt == {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
    assert params == SamplingParams(max_tokens=3, temperature=0, top_k=5)

    chunks = list(client.chat.completions.create(model="fake-text", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from the fake model."
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == 5
    assert engine.requests[-1][1].max_tokens is None  # OpenAI's default: until the model stops


def test_multimodal_parts_are_decoded(app_client):
    http, engine = app_client("text")
    image_url = image_to_data_url(Image.new("RGB", (8, 8), (1, 2, 3)))
    _client(http).chat.completions.create(model="fake-text", messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": image_url}},
        {"type": "input_audio", "input_audio": {"data": _wav(), "format": "wav"}},
    ]}])
    [message] = engine.requests[-1][0]["messages"]
    kinds = [p["type"] for p in message["content"]]
    assert kinds == ["text", "image", "audio"]
    assert message["content"][1]["image"].getpixel((0, 0)) == (1, 2, 3)
    assert message["content"][2]["sample_rate"] == 16000 and len(message["content"][2]["audio"]) == 1600


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 5}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 99}, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}},
     "response_format.json_schema"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}, "response_format.type"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "num_inference_steps": 4}, "num_inference_steps"),
])
def test_chat_validation_errors(app_client, body, param):
    http, engine = app_client("text")
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
    assert engine.requests == []


def test_unknown_sampling_field_and_audio_on_a_text_model(app_client):
    http, _ = app_client("text")
    resp = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "tempreature": 1})
    assert resp.status_code == 400 and "tempreature" in resp.json()["error"]["message"]
    resp = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                   "modalities": ["text", "audio"]})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "unsupported_route"


def test_omni_audio_answer_and_streamed_audio(app_client):
    http, engine = app_client("omni")
    client = _client(http)
    reply = client.chat.completions.create(model="fake-omni", messages=[{"role": "user", "content": "hi"}],
                                           modalities=["text", "audio"], audio={"voice": "Chelsie", "format": "wav"})
    audio = reply.choices[0].message.audio
    assert audio.transcript == "Hello from the fake model." and audio.id.startswith("audio_")
    wave, rate = sf.read(io.BytesIO(base64.b64decode(audio.data)))
    assert rate == 16000 and len(wave) == 2400
    assert set(engine.raw_params[-1]) == {"thinker"}  # params go to the entry stage only
    assert engine.requests[-1][0]["voice"] == "Chelsie"  # omni models read the voice from the prompt

    chunks = list(client.chat.completions.create(model="fake-omni", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True,
                                                 modalities=["text", "audio"],
                                                 audio={"voice": "Chelsie", "format": "pcm16"}))
    deltas = [c.choices[0].delta.audio for c in chunks if c.choices and c.choices[0].delta.audio]
    transcript = "".join(d.transcript or "" for d in deltas)
    pcm = b"".join(base64.b64decode(d.data) for d in deltas if d.data)
    assert deltas[-1].expires_at and not deltas[-1].data  # OpenAI's last audio update: the expiry
    assert transcript == "Hello from the fake model."
    assert len(pcm) == 2 * 2400 * 24000 // 16000  # 24 kHz PCM16

    resp = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "stream": True,
                                                   "modalities": ["audio"], "audio": {"format": "wav"}})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "audio.format"


def test_omni_chat_asks_the_engine_for_only_the_modalities_it_answers_with(app_client):
    http, engine = app_client("omni")
    message = [{"role": "user", "content": "hi"}]
    for modalities, wanted in ((["text"], ("text",)), (None, ("text",)), (["text", "audio"], ("text", "audio")),
                               (["audio"], ("text", "audio"))):  # a spoken answer carries its transcript
        body = {"messages": message, **({"modalities": modalities} if modalities else {})}
        resp = http.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200, resp.text
        assert engine.modalities[-1] == wanted
    answer = http.post("/v1/chat/completions", json={"messages": message, "modalities": ["text"]}).json()
    assert answer["choices"][0]["message"]["content"] == "Hello from the fake model."
    assert answer["choices"][0]["message"].get("audio") is None
    text_http, text_engine = app_client("text")
    text_http.post("/v1/chat/completions", json={"messages": message})
    assert text_engine.modalities == [("text",)]
    image_http, image_engine = app_client("image")
    image_http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a fox"}]})
    assert image_engine.modalities == [None]  # an image model's one output


def test_image_model_answers_with_image_parts(app_client):
    http, engine = app_client("image")
    resp = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "a red fox"}], "size": "32x16", "num_inference_steps": 2, "seed": 4})
    assert resp.status_code == 200, resp.text
    [part] = resp.json()["choices"][0]["message"]["content"]
    assert part["type"] == "image_url" and part["image_url"]["url"].startswith("data:image/png;base64,")
    prompt, params, _ = engine.requests[-1]
    assert prompt == "a red fox" and (params.width, params.height, params.seed) == (32, 16, 4)

    with http.stream("POST", "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                           "stream": True}) as resp:
        lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    payloads = [json.loads(line[6:]) for line in lines[:-1]]
    assert any(isinstance(p["choices"][0]["delta"].get("content"), list) for p in payloads)


def test_stream_reports_engine_failure_in_band(app_client):
    http, engine = app_client("text")

    async def failing(prompt, params=None, request_id=None, modalities=None, session_id=None):
        from omnistage.engine.outputs import OmniOutput

        yield OmniOutput(request_id, text="Hel", text_delta="Hel")
        yield OmniOutput(request_id, finished=True, finish_reason="error", error="stage 0 (llm): engine step raised")

    engine.generate = failing
    with http.stream("POST", "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                           "stream": True}) as resp:
        assert resp.status_code == 200
        lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["error"]["type"] == "server_error"
    assert http.app.state.gateway.num_admitted == 0


def test_fields_and_modalities_the_model_does_not_have(app_client):
    http, _ = app_client("image")
    for body, param in (({"max_tokens": 5}, "max_tokens"), ({"modalities": ["text"]}, "modalities")):
        resp = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], **body})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text


def test_the_server_sends_only_the_fields_the_client_gave(app_client):
    """The engine fills the rest from the stage's deploy defaults (test_openai_deploy_defaults.py)."""
    http, engine = app_client("text")
    resp = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "temperature": 0})
    assert resp.status_code == 200
    params = engine.requests[-1][1]
    assert params.fields_set == {"temperature"} and params.max_tokens is None  # chat's own default: unbounded
