"""The speech table's batch route for the omni models: `POST /v1/chat/completions/batch` on the
zoo's random Qwen2.5-Omni answers each conversation with its own spoken reply (`message.audio`)."""

from __future__ import annotations

import base64
import io
import json

import pytest
import soundfile as sf
from remote_server import RemoteServer

pytestmark = pytest.mark.e2e


def test_each_conversation_gets_its_own_audio(zoo):
    # A random talker rarely emits its end code: cap its codes; a floor and a seed keep every answer audible.
    talker_cap = json.dumps({"1": {"default_sampling_params": {"max_tokens": 16, "min_tokens": 8, "seed": 0}}})
    with RemoteServer(zoo("qwen2.5-omni"), "--served-model-name", "omni", "--stage-overrides", talker_cap,
                      in_process=True) as server, server.http() as http:
        resp = http.post("/v1/chat/completions/batch", json={
            "model": "omni", "max_tokens": 4, "temperature": 0, "modalities": ["text", "audio"],
            "audio": {"voice": "Ethan", "format": "wav"},
            "messages": [[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Bye"}]]})
    assert resp.status_code == 200, resp.text
    choices = resp.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    for choice in choices:
        audio = choice["message"]["audio"]
        wave, rate = sf.read(io.BytesIO(base64.b64decode(audio["data"])))
        assert rate == 24000 and len(wave) > 0 and audio["transcript"]  # the spoken text
