"""WS /v1/realtime and POST /v1/audio/transcriptions on `omnistage serve` with the zoo's
random Qwen2.5-Omni, behind an API key (one server for the module): the official `openai`
SDK (`client.realtime.connect`, `client.audio.transcriptions.create`) unmodified, and a
plain `websockets` client that speaks (the synthetic voice), is heard by the server's
silero VAD, is answered in audio, and barges in on a second answer. Each cancelled or
dropped answer leaves no request in the engine (`omnistage_queue_depth` back to 0)."""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "e2e"))
from remote_server import RemoteServer  # noqa: E402

from omnistage.entrypoints.openai.realtime import audio_format  # noqa: E402
from omnistage.testing.voice import synthetic_speech  # noqa: E402

pytestmark = pytest.mark.e2e

KEY = "k3y"
# A random talker rarely emits its end code and a random thinker rarely stops: cap both.
# Floors too: a random talker may end at once, leaving an answer with no audio (flaky without).
OVERRIDES = {"0": {"default_sampling_params": {"max_tokens": 6, "min_tokens": 2}},
             "1": {"default_sampling_params": {"max_tokens": 24, "min_tokens": 8, "seed": 0}}}


@pytest.fixture(scope="module")
def server(zoo):
    server = RemoteServer(zoo("qwen2.5-omni"), "--served-model-name", "omni",
                          "--stage-overrides", json.dumps(OVERRIDES), api_key=KEY, in_process=True)
    yield server
    assert server.stop() == 0


def queue_depth(server: RemoteServer) -> float:
    text = server.http().get("/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("omnistage_queue_depth ")))


def wait_idle(server: RemoteServer) -> None:
    deadline = time.time() + 10
    while queue_depth(server) != 0 and time.time() < deadline:
        time.sleep(0.1)
    assert queue_depth(server) == 0


def test_official_sdk_two_turns_with_audio_out(server):
    client = server.client()
    speech = audio_format.encode(synthetic_speech(0.5), 24000, "audio/pcm")
    with client.realtime.connect(model="omni") as conn:
        conn.session.update(session={"type": "realtime", "output_modalities": ["audio"], "instructions": "Be brief.",
                                     "audio": {"input": {"turn_detection": None}, "output": {"voice": "Chelsie"}}})
        conn.input_audio_buffer.append(audio=base64.b64encode(speech).decode())
        conn.input_audio_buffer.commit()
        conn.response.create()
        events = []
        for event in conn:
            events.append(event)
            if event.type == "response.done":
                break
        kinds = [e.type for e in events]
        assert kinds[:2] == ["session.created", "session.updated"]
        assert "input_audio_buffer.committed" in kinds and "response.created" in kinds
        audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
        transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
        assert len(audio) > 0 and len(audio) % 2 == 0 and transcript
        done = events[-1].response
        assert done.status in ("completed", "incomplete") and done.usage.input_tokens > 0
        first_prompt = done.usage.input_tokens

        conn.conversation.item.create(item={"type": "message", "role": "user",
                                            "content": [{"type": "input_text", "text": "Again."}]})
        conn.response.create(response={"output_modalities": ["text"]})
        for event in conn:
            if event.type == "response.done":
                break
        # the second turn reads the first (its audio, the answer's words) before the new text
        assert event.response.usage.input_tokens > first_prompt
    wait_idle(server)


def test_websockets_client_server_vad_answer_and_barge_in(server):
    url = server.url.replace("http", "ws") + "/v1/realtime?model=omni"
    with pytest.raises(Exception):  # no key: refused on the upgrade
        with connect(url) as ws:
            ws.recv(timeout=5)
    silence, voice = np.zeros(12000, np.float32), synthetic_speech(1.0)
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        def until(kind: str) -> list[dict]:
            events = []
            while True:
                events.append(json.loads(ws.recv(timeout=120)))
                if events[-1]["type"] == kind:
                    return events

        def say(audio: np.ndarray) -> None:
            for i in range(0, len(audio), 2400):
                ws.send(json.dumps({"type": "input_audio_buffer.append",
                                    "audio": base64.b64encode(audio_format.encode(audio[i:i + 2400], 24000,
                                                                                  "audio/pcm")).decode()}))

        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "session": {"audio": {
            "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}},
            "output": {"format": {"type": "audio/pcmu"}}}}}))
        assert until("session.updated")[-1]["session"]["audio"]["output"]["format"] == {"type": "audio/pcmu"}
        say(np.concatenate([silence, voice, silence, silence]))
        events = until("response.done")
        kinds = [e["type"] for e in events]
        for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                     "input_audio_buffer.committed", "response.created", "response.output_audio.delta"):
            assert kind in kinds, kind
        assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("response.created")
        mulaw = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
        assert len(mulaw) > 0  # one byte a sample at 8 kHz

        # a second turn, and the user talks again 0.2 s after the turn ends (sent at once, so the
        # server hears it within milliseconds of starting the answer, however fast the engine):
        # the answer is cancelled, and its request aborted
        say(np.concatenate([voice, silence, voice]))
        until("response.created")
        events = until("response.done")
        assert "input_audio_buffer.speech_started" in [e["type"] for e in events]
        assert events[-1]["response"]["status_details"]["reason"] == "turn_detected"
    wait_idle(server)  # the socket is gone and so is the answer the VAD started after barge-in


def test_official_sdk_transcriptions_and_translations(server):
    import io

    import soundfile as sf

    client = server.client()
    wav = io.BytesIO()
    sf.write(wav, synthetic_speech(1.0, rate=16000), 16000, format="WAV")
    audio = ("speech.wav", wav.getvalue(), "audio/wav")
    answer = client.audio.transcriptions.create(model="omni", file=audio, language="en", temperature=0)
    assert answer.text and answer.usage.input_tokens > 0
    assert client.audio.transcriptions.create(model="omni", file=audio, response_format="text",
                                              temperature=0) == answer.text  # greedy: the same words
    verbose = client.audio.transcriptions.create(model="omni", file=audio, response_format="verbose_json",
                                                 timestamp_granularities=["segment"], temperature=0)
    assert verbose.duration == 1.0 and verbose.segments[0].end == 1.0
    events = list(client.audio.transcriptions.create(model="omni", file=audio, stream=True, temperature=0))
    assert events[-1].type == "transcript.text.done" and events[-1].text == answer.text
    assert "".join(e.delta for e in events[:-1]).strip() == answer.text
    translation = client.audio.translations.create(model="omni", file=audio, response_format="verbose_json")
    assert translation.text and translation.duration == 1.0
    wait_idle(server)


def test_reference_variant_client(server):
    """A client of the reference system's own variant (commit `final`, transcription.* and
    response.audio.* events with sample_rate_hz), on the real model."""
    url = server.url.replace("http", "ws") + "/v1/realtime"
    speech = (synthetic_speech(0.5, rate=16000) * 32767).astype("<i2").tobytes()
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "model": "omni"}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": False}))
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(speech).decode()}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        events = []
        while not events or events[-1]["type"] != "response.audio.done":
            events.append(json.loads(ws.recv(timeout=120)))
    done = next(e for e in events if e["type"] == "transcription.done")
    assert done["text"] == "".join(e["delta"] for e in events if e["type"] == "transcription.delta")
    assert done["usage"]["prompt_tokens"] > 0 and events[-1]["has_audio"]
    assert {e["sample_rate_hz"] for e in events if e["type"] == "response.audio.delta"} == {24000}
    wait_idle(server)


def test_duplex_falls_back_to_turns_on_a_model_without_duplex(server):
    # As the reference: `?duplex=1` on a turn-based model gets the turn-based session, which says
    # so in its capabilities; the duplex-only route is refused.
    url = server.url.replace("http", "ws")
    auth = {"Authorization": f"Bearer {KEY}"}
    with connect(url + "/v1/realtime?model=omni&duplex=1", additional_headers=auth) as ws:
        created = json.loads(ws.recv(timeout=30))
        assert created["type"] == "session.created"
        caps = created["session"]["capabilities"]
        assert caps["duplex"] is False and caps["supports_client_commit"] is True
        ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}))
        assert json.loads(ws.recv(timeout=30))["type"] == "session.updated"
        speech = audio_format.encode(synthetic_speech(0.2), 24000, "audio/pcm")
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(speech).decode()}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "input_audio_buffer.committed"  # a turn, by commit
    with connect(url + "/v1/duplex?model=omni", additional_headers=auth) as ws:
        error = json.loads(ws.recv(timeout=30))
        assert error["type"] == "error" and error["error"]["code"] == "unsupported_route"
        assert "Duplex API is not available" in error["error"]["message"]
