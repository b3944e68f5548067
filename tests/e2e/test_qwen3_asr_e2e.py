"""`omnistage serve` on the zoo's Qwen3-ASR (one server for the module), through the official
`openai` SDK unmodified: `client.audio.transcriptions.create` in each response format, streamed,
with a language, a context prompt and a temperature: every format carries the same transcript,
and the stream's deltas add up to it. Refused, as OpenAI errors naming the field or route: times
(the model gives none), a language it does not know, and translations. That the transcript is
transformers' is tests/models/test_qwen3_asr.py (one server start is most of this file's time)."""

from __future__ import annotations

import base64
import io
import json

import openai
import pytest
import soundfile as sf
from remote_server import RemoteServer

from omnistage.testing.qwen3_asr_models import QWEN3_ASR_SAMPLE_RATE, asr_clips

pytestmark = pytest.mark.e2e

MAX_TOKENS = 12  # a random decoder rarely stops by itself


@pytest.fixture(scope="module")
def server(zoo):
    overrides = {"0": {"default_sampling_params": {"temperature": 0, "max_tokens": MAX_TOKENS}}}
    with RemoteServer(zoo("qwen3-asr"), "--served-model-name", "asr", "--stage-overrides", json.dumps(overrides), in_process=True) as s:
        yield s


@pytest.fixture(scope="module")
def clip():
    return asr_clips((1.5,))[0]


@pytest.fixture(scope="module")
def upload(clip):
    out = io.BytesIO()
    sf.write(out, clip, QWEN3_ASR_SAMPLE_RATE, subtype="FLOAT", format="WAV")
    return ("clip.wav", out.getvalue(), "audio/wav")


def test_each_format_and_the_stream(server, upload):
    client = server.client()
    answer = client.audio.transcriptions.create(model="asr", file=upload, language="en", prompt="Names: Quilter.",
                                                temperature=0.0)
    expected = answer.text
    assert expected and 0 < answer.usage.output_tokens <= MAX_TOKENS
    kwargs = dict(model="asr", file=upload, language="en", prompt="Names: Quilter.")
    assert client.audio.transcriptions.create(response_format="text", **kwargs) == expected
    verbose = client.audio.transcriptions.create(response_format="verbose_json", **kwargs)
    assert verbose.text == expected and verbose.language == "english" and verbose.duration == 1.5
    srt = client.audio.transcriptions.create(response_format="srt", **kwargs)
    assert srt == f"1\n00:00:00,000 --> 00:00:01,500\n{expected}\n"
    vtt = client.audio.transcriptions.create(response_format="vtt", **kwargs)
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\n")

    detected = client.audio.transcriptions.create(model="asr", file=upload).text  # the model names the language
    events = list(client.audio.transcriptions.create(model="asr", file=upload, stream=True))
    assert events[-1].type == "transcript.text.done" and events[-1].text == detected
    assert len(events) > 2 and "".join(e.delta for e in events[:-1]) == detected

    # Chat with the audio alone is the same prompt (the template keeps system text and audio only).
    audio = {"data": base64.b64encode(upload[1]).decode(), "format": "wav"}
    chat = client.chat.completions.create(model="asr", messages=[
        {"role": "user", "content": [{"type": "input_audio", "input_audio": audio}]}])
    assert chat.choices[0].message.content.strip() == detected


def test_refusals(server, upload):
    client = server.client()
    for kwargs, param in (({"timestamp_granularities": ["segment"], "response_format": "verbose_json"},
                           "timestamp_granularities"), ({"language": "xx"}, "language")):
        with pytest.raises(openai.BadRequestError) as e:
            client.audio.transcriptions.create(model="asr", file=upload, **kwargs)
        assert e.value.body["param"] == param, e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.translations.create(model="asr", file=upload)
    assert e.value.body["code"] == "unsupported_route"
