"""`POST /v1/responses` on the zoo's random Qwen2.5-Omni, through the official client: an
image input reaches the thinker (more prompt tokens than the text alone), and asking for
audio gives an `output_audio` part (whole) and `response.audio.delta` events (streamed)."""

from __future__ import annotations

import base64
import io
import json

import pytest
import soundfile as sf
from PIL import Image
from remote_server import RemoteServer

from omnistage.media.image import image_to_data_url

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(zoo):
    # A random talker rarely emits its end code: cap its codes so the test stays short; and, unseeded,
    # it may emit it first (no audio): a floor and a seed keep every answer audible.
    talker_cap = json.dumps({"1": {"default_sampling_params": {"max_tokens": 32, "min_tokens": 8, "seed": 0}}})
    with RemoteServer(zoo("qwen2.5-omni"), "--served-model-name", "omni", "--stage-overrides", talker_cap, in_process=True) as s:
        yield s


def test_image_input_and_audio_output(server):
    client = server.client()
    text_only = client.responses.create(model="omni", input="What is this?", max_output_tokens=4, temperature=0)
    image = image_to_data_url(Image.new("RGB", (56, 56), (200, 30, 30)))
    with_image = client.responses.create(model="omni", max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                     {"type": "input_image", "image_url": image}]}])
    assert with_image.usage.input_tokens > text_only.usage.input_tokens  # the image's tokens are in the prompt

    audio_fields = {"modalities": ["text", "audio"], "audio": {"voice": "Chelsie", "format": "wav"}}
    reply = client.responses.create(model="omni", input="Say hello", max_output_tokens=8, temperature=0,
                                    extra_body=audio_fields)
    raw = server.http().get(f"/v1/responses/{reply.id}").json()
    text, audio = raw["output"][0]["content"]
    assert text["type"] == "output_text" and audio["type"] == "output_audio"
    wave, rate = sf.read(io.BytesIO(base64.b64decode(audio["data"])))
    assert rate == 24000 and len(wave) > 0 and audio["transcript"] == text["text"]

    events = list(client.responses.create(model="omni", input="Say hello", max_output_tokens=8, temperature=0,
                                          stream=True, extra_body={**audio_fields, "audio": {"format": "pcm16"}}))
    pcm = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.audio.delta")
    assert len(pcm) > 0 and len(pcm) % 2 == 0
    assert events[-1].response.output_text == reply.output_text  # greedy: the same text
