"""POST /v1/audio/transcriptions over the fake omni engine: the thinker alone hears the
upload, and each response_format (and the SSE stream) has OpenAI's shape. The official
SDK against the zoo Qwen2.5-Omni is in test_realtime_e2e.py (one server for both)."""

from __future__ import annotations

import io
import json

import numpy as np
import soundfile as sf

TEXT = "Hello from the fake model."


def wav(seconds: float = 1.5, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    sf.write(out, np.zeros(int(seconds * rate), np.float32), rate, format="WAV")
    return out.getvalue()


def post(client, **fields):
    return client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav(), "audio/wav")},
                       data={k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in fields.items()})


def test_each_response_format(app_client):
    client, engine = app_client("omni")
    answer = post(client, model="fake-omni", language="de", prompt="Grüße")
    assert answer.status_code == 200 and answer.json()["text"] == TEXT
    assert answer.json()["usage"] == {"type": "tokens", "input_tokens": 7, "output_tokens": 5, "total_tokens": 12}
    prompt, _, _ = engine.requests[0]
    audio, instruction = prompt["messages"][0]["content"]
    assert audio["type"] == "audio" and audio["sample_rate"] == 16000 and len(audio["audio"]) == 24000
    assert "'de'" in instruction["text"] and "Grüße" in instruction["text"]
    assert engine.modalities == [("text",)]  # no talker, no vocoder
    assert post(client, response_format="text").text == TEXT
    verbose = post(client, response_format="verbose_json", timestamp_granularities="segment").json()
    assert verbose["duration"] == 1.5 and verbose["segments"][0]["end"] == 1.5 and verbose["text"] == TEXT
    assert post(client, response_format="srt").text == f"1\n00:00:00,000 --> 00:00:01,500\n{TEXT}\n"
    assert post(client, response_format="vtt").text == f"WEBVTT\n\n00:00:00.000 --> 00:00:01.500\n{TEXT}\n"


def test_streamed_transcript(app_client):
    client, _ = app_client("omni")
    answer = post(client, stream=True)
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["transcript.text.delta"] * 5 + ["transcript.text.done"]
    assert "".join(e["delta"] for e in events[:-1]) == TEXT and events[-1]["text"] == TEXT


def test_bad_requests_name_the_field(app_client):
    client, _ = app_client("omni")
    for fields, param in (({"stream": True, "response_format": "srt"}, "response_format"),
                          ({"timestamp_granularities": "segment"}, "timestamp_granularities"),
                          ({"timestamp_granularities": "word", "response_format": "verbose_json"},
                           "timestamp_granularities"),
                          ({"temperature": 3}, "temperature"), ({"nonsense": 1}, "nonsense")):
        answer = post(client, **fields)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.json()
    answer = client.post("/v1/audio/transcriptions", data={"model": "fake-omni"},
                         files={"other": ("a.wav", wav(), "audio/wav")})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "other"
    answer = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", b"not audio", "audio/wav")})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "file"
    text_client, _ = app_client("text")
    answer = post(text_client)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "unsupported_route"


def test_translation_asks_for_english_and_takes_no_language(app_client):
    client, engine = app_client("omni")
    answer = client.post("/v1/audio/translations", files={"file": ("a.wav", wav(), "audio/wav")},
                         data={"response_format": "verbose_json", "prompt": "Earlier words."})
    assert answer.status_code == 200
    assert answer.json()["task"] == "translate" and answer.json()["language"] == "english"
    instruction = engine.requests[0][0]["messages"][0]["content"][1]["text"]
    assert instruction.startswith("Translate the speech in this audio into English") and "Earlier words." in instruction
    answer = client.post("/v1/audio/translations", files={"file": ("a.wav", wav(), "audio/wav")},
                         data={"language": "de"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "language"
