"""WS /v1/realtime on the other omni family: the zoo's random Qwen3-Omni (thinker, talker
with its code predictor, code2wav) behind `omnistage serve`, one turn through the official
SDK with audio in and audio out."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "e2e"))
from remote_server import RemoteServer  # noqa: E402

from omnistage.entrypoints.openai.realtime import audio_format  # noqa: E402
from omnistage.testing.voice import synthetic_speech  # noqa: E402

pytestmark = pytest.mark.e2e

# Floors too: a random talker may end at once, leaving an answer with no audio (flaky without).
OVERRIDES = {"0": {"default_sampling_params": {"max_tokens": 6, "min_tokens": 2}},
             "1": {"default_sampling_params": {"max_tokens": 16, "min_tokens": 8, "seed": 0}}}


@pytest.fixture(scope="module")
def server(zoo):
    server = RemoteServer(zoo("qwen3-omni"), "--served-model-name", "omni3",
                          "--stage-overrides", json.dumps(OVERRIDES), in_process=True)
    yield server
    assert server.stop() == 0


def test_one_spoken_turn_through_the_sdk(server):
    speech = audio_format.encode(synthetic_speech(0.5), 24000, "audio/pcm")
    with server.client().realtime.connect(model="omni3") as conn:
        conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        conn.input_audio_buffer.append(audio=base64.b64encode(speech).decode())
        conn.input_audio_buffer.commit()
        conn.response.create()
        audio = b""
        for event in conn:
            if event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            if event.type == "response.done":
                break
    assert event.response.status in ("completed", "incomplete") and event.response.usage.input_tokens > 0
    assert len(audio) > 0 and len(audio) % 2 == 0
