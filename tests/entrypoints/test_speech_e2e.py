"""`omnistage serve` on the tiny CSM (served from the test process): streamed speech through
the official `openai` client, voice cloning over multipart HTTP, and the WebSocket session over a real
socket (uvicorn + websockets), all behind an API key."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from remote_server import RemoteServer  # noqa: E402

pytestmark = pytest.mark.e2e

FRAMES, SAMPLES_PER_FRAME = 10, 1920
OVERRIDES = {"0": {"default_sampling_params": {"max_tokens": FRAMES, "temperature": 0}}, "*": {"max_num_seqs": 4}}
KEY = "k3y"


@pytest.fixture(scope="module")
def server(zoo):
    server = RemoteServer(zoo("csm"), "--served-model-name", "csm", "--stage-overrides", json.dumps(OVERRIDES),
                          api_key=KEY, in_process=True)
    yield server
    assert server.stop() == 0


def test_streamed_speech_with_the_official_client(server):
    client = server.client()
    with client.audio.speech.with_streaming_response.create(
            model="csm", voice="nova", input="Hello there. How are you?", response_format="pcm",
            extra_body={"stream_format": "audio"}) as resp:
        assert resp.headers["x-sample-rate"] == "24000"
        pieces = [piece for piece in resp.iter_bytes() if piece]
    assert len(b"".join(pieces)) == 2 * FRAMES * SAMPLES_PER_FRAME
    assert len(pieces) >= 2  # the first chunk (2 frames) left before the rest was made

    wav = client.audio.speech.create(model="csm", voice="alloy", input="Hi.", response_format="wav")
    audio, rate = sf.read(io.BytesIO(wav.content))
    assert rate == 24000 and len(audio) == FRAMES * SAMPLES_PER_FRAME

    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'omnistage_request_time_to_first_audio_seconds_count{pipeline="csm"}' in metrics


def test_cloned_voice_over_http(server):
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(np.linspace(0, 400 * np.pi, 22050)), 22050, format="FLAC")
    with server.http() as http:
        resp = http.post("/v1/audio/voices", data={"name": "narrator", "ref_text": "Once upon a time."},
                         files={"audio_sample": ("ref.flac", buf.getvalue(), "audio/flac")})
        assert resp.status_code == 200, resp.text
        assert resp.json()["sample_rate"] == 22050
        bad = http.post("/v1/audio/voices", data={"name": "broken"},
                        files={"audio_sample": ("ref.wav", b"RIFF....garbage", "audio/wav")})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "audio_sample"
        names = [v["name"] for v in http.get("/v1/audio/voices").json()["data"]]
        assert "narrator" in names and "broken" not in names
    client = server.client()
    cloned = client.audio.speech.create(model="csm", voice="narrator", input="Hello.", response_format="pcm")
    plain = client.audio.speech.create(model="csm", voice="alloy", input="Hello.", response_format="pcm")
    assert len(cloned.content) == len(plain.content) and cloned.content != plain.content
    with server.http() as http:
        assert http.delete("/v1/audio/voices/narrator").status_code == 200


def test_websocket_session_over_a_real_socket(server):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with pytest.raises(InvalidStatus):
        connect(url).close()  # no API key
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send(json.dumps({"type": "session.config", "response_format": "wav"}))
        ws.send(json.dumps({"type": "input.text", "text": "One. Two"}))
        ws.send("{malformed")
        ws.send(json.dumps({"type": "input.text", "text": "."}))
        ws.send(json.dumps({"type": "input.done"}))
        events, num_bytes = [], 0
        while not events or events[-1]["type"] != "session.done":
            message = ws.recv(timeout=120)
            if isinstance(message, bytes):
                num_bytes += len(message)
            else:
                events.append(json.loads(message))
    kinds = [e["type"] for e in events]
    assert kinds.count("error") == 1 and kinds.count("audio.start") == 2 and kinds.count("audio.done") == 2
    assert [e["sentence_text"] for e in events if e["type"] == "audio.start"] == ["One.", "Two."]
    assert num_bytes == 2 * (44 + 2 * FRAMES * SAMPLES_PER_FRAME)  # per sentence: WAV header + PCM16
    assert events[-1] == {"type": "session.done", "total_sentences": 2}
