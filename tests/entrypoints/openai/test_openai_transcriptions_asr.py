"""POST /v1/audio/transcriptions on a speech recognition family (Qwen3-ASR's spec) over the fake
engine: the family builds the prompt (context, audio, forced language), and only the transcript
of its answer "language English<asr_text>..." is answered and streamed; the language it names
goes in verbose_json. Refused: times, translations and a language the model does not know.
The real model behind the official SDK is tests/e2e/test_qwen3_asr_e2e.py."""

from __future__ import annotations

import json

from fake_engine import TEXT
from test_openai_transcriptions import post, wav

TRANSCRIPT = "".join(TEXT)


def test_prompt_and_each_response_format(app_client):
    client, engine = app_client("asr")
    answer = post(client, prompt="Names: Quilter.")
    assert answer.status_code == 200, answer.json()
    assert answer.json()["text"] == TRANSCRIPT  # the "language English<asr_text>" tag is not transcript
    messages = engine.requests[0][0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]  # no language: the model detects it
    assert messages[0]["content"][0]["text"] == "Names: Quilter."
    assert messages[1]["content"][0]["sample_rate"] == 16000 and len(messages[1]["content"][0]["audio"]) == 24000
    assert engine.modalities == [("text",)]

    post(client, language="de")  # forced: the assistant turn starts with the tag, in the model's words
    assert engine.requests[1][0]["messages"][-1] == {
        "role": "assistant", "content": [{"type": "text", "text": "language German<asr_text>"}]}
    assert post(client, response_format="text").text == TRANSCRIPT
    verbose = post(client, response_format="verbose_json").json()
    assert verbose["language"] == "english" and verbose["text"] == TRANSCRIPT and len(verbose["segments"]) == 1
    assert post(client, response_format="srt").text == f"1\n00:00:00,000 --> 00:00:01,500\n{TRANSCRIPT}\n"
    assert post(client, response_format="vtt").text == f"WEBVTT\n\n00:00:00.000 --> 00:00:01.500\n{TRANSCRIPT}\n"


def test_stream_holds_back_the_language_tag(app_client):
    client, _ = app_client("asr")
    answer = post(client, stream=True)
    events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
    deltas = [e["delta"] for e in events if e["type"] == "transcript.text.delta"]
    assert "".join(deltas) == TRANSCRIPT and deltas[0] == "Hello"
    assert events[-1]["type"] == "transcript.text.done" and events[-1]["text"] == TRANSCRIPT


def test_refusals_name_the_field(app_client):
    client, engine = app_client("asr")
    for fields, param in (({"timestamp_granularities": "segment", "response_format": "verbose_json"},
                           "timestamp_granularities"), ({"language": "xx"}, "language")):
        answer = post(client, **fields)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.json()
    answer = client.post("/v1/audio/translations", files={"file": ("a.wav", wav(), "audio/wav")})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "unsupported_route"
    assert "POST /v1/audio/transcriptions" in answer.json()["error"]["message"]
    assert engine.requests == []
