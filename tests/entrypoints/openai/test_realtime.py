"""WS /v1/realtime over the fake omni engine (in-process app, Starlette's TestClient):
the Realtime protocol's events, the conversation the engine is given, cancelling and
barge-in (each aborts the engine request), the real silero VAD on a synthetic voice,
the session limits and the API key. The live server and the official SDK are in
test_realtime_e2e.py."""

from __future__ import annotations

import base64
import time

import numpy as np
import pytest
from starlette.websockets import WebSocketDisconnect

from omnistage.entrypoints.openai.realtime import audio_format
from omnistage.testing.voice import synthetic_speech
from ws_events import until

URL = "/v1/realtime?model=fake-omni"
NO_VAD = {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def pcm(audio: np.ndarray) -> str:
    return b64(audio_format.encode(audio, 24000, "audio/pcm"))



def first_answer_audio(engine) -> np.ndarray:
    """The user audio of the first answer's prompt (its clips joined: a turn prefilled while spoken is cut)."""
    prompt = next(prompt for prompt, _, rid in engine.requests if rid.startswith("resp_"))
    return np.concatenate([p["audio"] for p in prompt["messages"][0]["content"] if p["type"] == "audio"])


def open_session(ws, update: dict | None = NO_VAD) -> dict:
    created = ws.receive_json()
    assert created["type"] == "session.created" and created["session"]["model"] == "fake-omni"
    if update is not None:
        ws.send_json(update)
        assert ws.receive_json()["type"] == "session.updated"
    return created


def test_text_turns_keep_the_conversation_and_answer_in_audio(app_client):
    client, engine = app_client("omni")
    with client.websocket_connect(URL) as ws:
        open_session(ws, {"type": "session.update", "session": {
            "type": "realtime", "instructions": "Be brief.",
            "audio": {"input": {"turn_detection": None}, "output": {"voice": "Ethan"}}}})
        ws.send_json({"type": "conversation.item.create",
                      "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}})
        added, done = ws.receive_json(), ws.receive_json()
        assert added["type"] == "conversation.item.added" and done["type"] == "conversation.item.done"
        ws.send_json({"type": "response.create"})
        events = until(ws, "response.done")
        kinds = [e["type"] for e in events]
        assert kinds[:4] == ["response.created", "response.output_item.added", "conversation.item.added",
                             "response.content_part.added"]
        assert kinds[-6:] == ["response.output_audio.done", "response.output_audio_transcript.done",
                              "response.content_part.done", "response.output_item.done", "conversation.item.done",
                              "response.done"]
        transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
        assert transcript == "Hello from the fake model."
        audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
        assert len(audio) == 2 * 3 * 800 * 24000 // 16000  # three 800-sample chunks at 16 kHz, as 24 kHz pcm16
        final = events[-1]["response"]
        assert final["status"] == "completed" and final["usage"]["input_tokens"] == 7
        assert final["output"][0]["content"][0] == {"type": "output_audio", "transcript": transcript}

        ws.send_json({"type": "conversation.item.create",
                      "item": {"role": "user", "content": [{"type": "input_text", "text": "And?"}]}})
        until(ws, "conversation.item.done")
        ws.send_json({"type": "response.create", "response": {"output_modalities": ["text"]}})
        events = until(ws, "response.done")
        assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == transcript
        assert not [e for e in events if e["type"] == "response.output_audio.delta"]
    first, second = engine.requests[0][0], engine.requests[1][0]
    assert first["voice"] == "Ethan" and "voice" not in second  # text answers run the thinker alone
    assert engine.modalities == [("text", "audio"), ("text",)]
    assert second["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                  {"role": "assistant", "content": transcript}, {"role": "user", "content": "And?"}]


@pytest.mark.parametrize("fmt, beta, rate", [("audio/pcm", "pcm16", 24000), ("audio/pcmu", "g711_ulaw", 8000),
                                              ("audio/pcma", "g711_alaw", 8000)])
def test_committed_audio_reaches_the_model_in_each_input_format(app_client, fmt, beta, rate):
    client, engine = app_client("omni")
    tone = (0.3 * np.sin(np.arange(rate // 5) * 2 * np.pi * 440 / rate)).astype(np.float32)  # 200 ms
    with client.websocket_connect(URL) as ws:
        open_session(ws, {"type": "session.update", "session": {"input_audio_format": beta, "turn_detection": None}})
        ws.send_json({"type": "input_audio_buffer.append", "audio": b64(audio_format.encode(tone, rate, fmt))})
        ws.send_json({"type": "input_audio_buffer.commit"})
        committed = ws.receive_json()
        assert committed["type"] == "input_audio_buffer.committed"
        assert until(ws, "conversation.item.done")[-1]["item"]["content"] == [{"type": "input_audio",
                                                                                "transcript": None}]
        ws.send_json({"type": "response.create"})
        until(ws, "response.done")
    part = engine.requests[0][0]["messages"][0]["content"][0]
    assert part["type"] == "audio" and part["sample_rate"] == rate
    assert np.abs(part["audio"] - tone).max() < 0.02  # G.711 is lossy; PCM is exact to 1/32768


def test_a_bad_event_gets_an_error_naming_the_field_and_the_session_goes_on(app_client):
    client, _ = app_client("omni")
    with client.websocket_connect(URL) as ws:
        open_session(ws)
        wav_format = {"audio": {"input": {"format": {"type": "audio/wav"}}}}
        bad = [({"type": "session.update", "event_id": "e1", "session": wav_format}, "session.audio.input.format.type"),
               ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "audio"),
               ({"type": "session.update", "session": {"tools": [{"type": "function"}]}}, "session.tools"),
               ({"type": "nonsense"}, "type"),
               ({"type": "conversation.item.create", "previous_item_id": "nope",
                 "item": {"role": "user", "content": [{"type": "input_text", "text": "x"}]}}, "previous_item_id")]
        for event, param in bad:
            ws.send_json(event)
            error = ws.receive_json()
            assert error["type"] == "error" and error["error"]["param"] == param, error
        assert error["error"]["type"] == "invalid_request_error"
        ws.send_json({"type": "input_audio_buffer.commit"})  # empty: refused by code
        assert ws.receive_json()["error"]["code"] == "input_audio_buffer_commit_empty"
        ws.send_json({"type": "response.cancel"})
        assert ws.receive_json()["error"]["code"] == "response_cancel_not_active"
        ws.send_text("{")
        assert ws.receive_json()["type"] == "error"
        ws.send_json({**NO_VAD, "event_id": "e9"})
        assert ws.receive_json()["type"] == "session.updated"  # still going


def test_cancel_aborts_the_engine_request(app_client):
    client, engine = app_client("omni", step_delay=0.2)
    gateway = client.app.state.gateway
    with client.websocket_connect(URL) as ws:
        open_session(ws)
        ws.send_json({"type": "conversation.item.create",
                      "item": {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}})
        until(ws, "conversation.item.done")
        ws.send_json({"type": "response.create"})
        events = until(ws, "response.output_audio_transcript.delta")
        ws.send_json({"type": "response.create"})  # one at a time
        ws.send_json({"type": "response.cancel"})
        events += until(ws, "response.done")
        errors = [e for e in events if e["type"] == "error"]
        assert [e["error"]["code"] for e in errors] == ["conversation_already_has_active_response"]
        done = events[-1]["response"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
        assert engine.aborted == [done["id"]] and gateway.num_admitted == 0
        # the cut answer stays in the conversation as far as it was sent
        sent = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
        assert done["output"][0]["content"][0]["transcript"] == sent != "Hello from the fake model."


def test_closing_the_socket_aborts_the_running_response(app_client):
    client, engine = app_client("omni", step_delay=0.2)
    with client.websocket_connect(URL) as ws:
        open_session(ws)
        ws.send_json({"type": "conversation.item.create",
                      "item": {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}})
        ws.send_json({"type": "response.create"})
        response_id = until(ws, "response.created")[-1]["response"]["id"]
    deadline = time.time() + 10  # the server notices the close on its own loop
    while not engine.aborted and time.time() < deadline:
        time.sleep(0.05)
    assert engine.aborted == [response_id] and client.app.state.gateway.num_admitted == 0


def test_server_vad_commits_a_turn_answers_it_and_barge_in_cancels(app_client):
    client, engine = app_client("omni", step_delay=0.3)
    silence, voice = np.zeros(24000 // 2, np.float32), synthetic_speech(1.0)
    with client.websocket_connect(URL) as ws:
        open_session(ws, {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
            "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 100, "silence_duration_ms": 300}}}}})
        audio = np.concatenate([silence, voice, silence, silence])
        for i in range(0, len(audio), 2400):  # 100 ms appends, as a microphone sends
            ws.send_json({"type": "input_audio_buffer.append", "audio": pcm(audio[i:i + 2400])})
        started = until(ws, "input_audio_buffer.speech_started")[-1]
        assert 300 <= started["audio_start_ms"] <= 500  # speech at 500 ms, less 100 ms of prefix padding
        stopped = until(ws, "input_audio_buffer.speech_stopped")[-1]
        assert 1400 <= stopped["audio_end_ms"] <= 1800 and stopped["item_id"] == started["item_id"]
        assert until(ws, "input_audio_buffer.committed")[-1]["item_id"] == started["item_id"]
        until(ws, "response.output_audio_transcript.delta")  # answered without response.create
        for i in range(0, len(voice), 2400):  # the user talks over the answer
            ws.send_json({"type": "input_audio_buffer.append", "audio": pcm(voice[i:i + 2400])})
        events = until(ws, "response.done")
        assert "input_audio_buffer.speech_started" in [e["type"] for e in events]
        done = events[-1]["response"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected"
        assert engine.aborted == [done["id"]]
    heard = first_answer_audio(engine)
    assert 0.9 * 24000 <= len(heard) <= 1.9 * 24000  # the turn, not the leading silence


def test_barge_in_stops_the_engine_request_within_one_step(app_client):
    """Speech that starts during an answer cancels it at once: after `speech_started` the engine
    runs at most the step it was in for that request (each output the fake yields is one step),
    and it is aborted before the user stops speaking. Without the cancel at speech start the
    answer would run on to its end (23 steps: long, so a loaded machine's VAD still hears the user first)."""
    client, engine = app_client("omni", step_delay=0.2)
    engine.text = engine.text * 4  # 20 text steps, then 3 of audio
    steps: dict[str, int] = {}
    generate = engine.generate

    async def counted(prompt, params=None, request_id=None, **kwargs):
        async for out in generate(prompt, params, request_id, **kwargs):
            steps[request_id] = steps.get(request_id, 0) + 1
            yield out

    engine.generate = counted
    voice = synthetic_speech(1.0)
    with client.websocket_connect(URL) as ws:
        open_session(ws, None)  # server VAD, interrupt_response on (the defaults)
        ws.send_json({"type": "conversation.item.create",
                      "item": {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}})
        ws.send_json({"type": "response.create"})
        events = until(ws, "response.output_audio_transcript.delta")
        response_id = events[-1]["response_id"]
        for i in range(0, len(voice), 2400):  # the user talks over the answer, and goes on talking
            ws.send_json({"type": "input_audio_buffer.append", "audio": pcm(voice[i:i + 2400])})
        until(ws, "input_audio_buffer.speech_started")
        steps_at_speech = steps[response_id]
        events = until(ws, "response.done")
        assert "input_audio_buffer.speech_stopped" not in [e["type"] for e in events]
        assert events[-1]["response"]["status_details"]["reason"] == "turn_detected"
        assert engine.aborted == [response_id] and client.app.state.gateway.num_admitted == 0
        time.sleep(3 * 0.2)  # three more steps' time: none of them is the aborted answer's
        assert steps[response_id] <= steps_at_speech + 1 < 23


def test_limits_end_the_session_with_an_error_then_a_close_code(app_client):
    client, _ = app_client("omni", realtime_max_buffer_s=0.5, realtime_idle_timeout_s=0.3)
    with client.websocket_connect(URL) as ws:
        open_session(ws)
        ws.send_json({"type": "input_audio_buffer.append", "audio": pcm(np.zeros(24000, np.float32))})
        assert ws.receive_json()["error"]["code"] == "input_audio_buffer_too_large"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1009
    with client.websocket_connect(URL) as ws:
        open_session(ws)
        assert ws.receive_json()["error"]["code"] == "idle_timeout"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1008
    client, _ = app_client("omni", realtime_max_session_s=0.3)
    with client.websocket_connect(URL) as ws:
        open_session(ws)
        assert ws.receive_json()["error"]["code"] == "session_expired"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1008


def test_api_key_model_and_capability_are_checked_on_the_upgrade(app_client):
    client, _ = app_client("omni", api_key="k3y")
    with pytest.raises(WebSocketDisconnect) as refused:
        with client.websocket_connect(URL) as ws:
            ws.receive_json()
    assert refused.value.code == 1008
    with client.websocket_connect(URL, headers={"authorization": "Bearer k3y"}) as ws:
        open_session(ws, None)
    # a browser sends the key as a subprotocol (it cannot set headers), and gets `realtime` back
    with client.websocket_connect(URL, subprotocols=["realtime", "openai-insecure-api-key.k3y"]) as ws:
        assert ws.accepted_subprotocol == "realtime"
        open_session(ws, None)
    with pytest.raises(WebSocketDisconnect):
        with client.websocket_connect(URL, subprotocols=["realtime", "openai-insecure-api-key.nope"]) as ws:
            ws.receive_json()
    with client.websocket_connect("/v1/realtime?model=other", headers={"authorization": "Bearer k3y"}) as ws:
        assert ws.receive_json()["error"]["param"] == "model"
    text_client, _ = app_client("text")
    with text_client.websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["error"]["code"] == "unsupported_route"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1008


def test_a_stopping_server_closes_sessions_with_going_away(app_client):
    client, engine = app_client("omni", step_delay=0.2)
    with client.websocket_connect(URL) as ws:
        open_session(ws)
        ws.send_json({"type": "conversation.item.create",
                      "item": {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}})
        ws.send_json({"type": "response.create"})
        response_id = until(ws, "response.created")[-1]["response"]["id"]
        client.portal.call(client.app.state.gateway.drain_after, 0)
        with pytest.raises(WebSocketDisconnect) as closed:
            while True:
                ws.receive_json()
        assert closed.value.code == 1001
    assert response_id in engine.aborted


def test_items_are_retrieved_truncated_and_deleted(app_client):
    client, engine = app_client("omni")
    with client.websocket_connect(URL) as ws:
        open_session(ws)
        for text in ("First", "Second"):
            content = [{"type": "input_text", "text": text}]
            ws.send_json({"type": "conversation.item.create",
                          "item": {"id": text.lower(), "role": "user", "content": content}})
            until(ws, "conversation.item.done")
        ws.send_json({"type": "response.create"})
        answer = until(ws, "response.done")[-1]["response"]["output"][0]["id"]
        ws.send_json({"type": "conversation.item.retrieve", "item_id": "first"})
        assert ws.receive_json()["item"]["content"] == [{"type": "input_text", "text": "First"}]
        ws.send_json({"type": "conversation.item.truncate", "item_id": "first", "content_index": 0,
                      "audio_end_ms": 100})
        assert ws.receive_json()["error"]["param"] == "content_index"
        ws.send_json({"type": "conversation.item.truncate", "item_id": answer, "content_index": 0,
                      "audio_end_ms": 151})  # the answer's audio is 150 ms
        assert ws.receive_json()["error"]["param"] == "audio_end_ms"
        ws.send_json({"type": "conversation.item.truncate", "item_id": answer, "content_index": 0,
                      "audio_end_ms": 100})
        assert ws.receive_json()["type"] == "conversation.item.truncated"
        ws.send_json({"type": "conversation.item.delete", "item_id": "first"})
        assert ws.receive_json() | {"event_id": None} == {"type": "conversation.item.deleted", "item_id": "first",
                                                         "event_id": None}
        ws.send_json({"type": "conversation.item.delete", "item_id": "first"})
        assert ws.receive_json()["error"]["param"] == "item_id"
        ws.send_json({"type": "response.create", "response": {"output_modalities": ["text"]}})
        until(ws, "response.done")
        ws.send_json({"type": "conversation.item.truncate", "item_id": answer, "content_index": 0,
                      "audio_end_ms": 50})
        assert ws.receive_json()["error"]["param"] == "item_id"  # only the latest answer's audio is kept
    # The truncated answer is what the model said in the 100 ms the client played (transcribed), the
    # first message is deleted: the next answer reads the second message and those words only.
    [(heard, _, _)] = [r for r in engine.requests if r[2].startswith("heard_")]
    assert len(heard["messages"][0]["content"][0]["audio"]) == 1600  # 100 ms at the model's 16 kHz
    answer = engine.requests[-1][0]["messages"]
    assert answer == [{"role": "user", "content": "Second"},
                      {"role": "assistant", "content": "Hello from the fake model."}]


def test_input_audio_transcription_of_a_committed_turn(app_client):
    client, engine = app_client("omni")
    tone = (0.3 * np.sin(np.arange(4800) * 2 * np.pi * 440 / 24000)).astype(np.float32)
    with client.websocket_connect(URL) as ws:
        open_session(ws)
        other_model = {"audio": {"input": {"transcription": {"model": "gpt-4o"}}}}
        ws.send_json({"type": "session.update", "session": other_model})
        assert ws.receive_json()["error"]["param"] == "session.audio.input.transcription.model"
        ws.send_json({"type": "session.update", "session": {"audio": {"input": {"transcription": {"language": "en"}}}}})
        assert ws.receive_json()["session"]["audio"]["input"]["transcription"]["language"] == "en"
        ws.send_json({"type": "input_audio_buffer.append", "audio": pcm(tone)})
        ws.send_json({"type": "input_audio_buffer.commit"})
        item_id = ws.receive_json()["item_id"]
        events = until(ws, "conversation.item.input_audio_transcription.completed")
        deltas = [e["delta"] for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
        assert "".join(deltas) == "Hello from the fake model." == events[-1]["transcript"]
        assert events[-1]["item_id"] == item_id and events[-1]["usage"]["input_tokens"] == 7
        ws.send_json({"type": "conversation.item.retrieve", "item_id": item_id})
        assert ws.receive_json()["item"]["content"][0]["transcript"] == "Hello from the fake model."
    prompt = engine.requests[0][0]["messages"][0]["content"]
    assert prompt[0]["type"] == "audio" and "'en'" in prompt[1]["text"] and engine.modalities == [("text",)]


def test_the_reference_systems_variant_of_the_route(app_client):
    """Clients of the reference system's own protocol (vLLM's, with vLLM-Omni's audio events):
    told apart by what they send, answered in its events, two turns in one conversation."""
    client, engine = app_client("omni")
    speech = (np.full(8000, 0.1) * 32767).astype("<i2").tobytes()  # 0.5 s of PCM16 at 16 kHz
    with client.websocket_connect(URL) as ws:
        ws.receive_json()  # session.created
        ws.send_json({"type": "session.update", "model": "fake-omni"})
        for turn in range(2):
            ws.send_json({"type": "input_audio_buffer.commit", "final": False})
            ws.send_json({"type": "input_audio_buffer.append", "audio": b64(speech)})
            ws.send_json({"type": "input_audio_buffer.commit", "final": True})
            events = until(ws, "response.audio.done")
            kinds = [e["type"] for e in events]
            assert kinds.count("transcription.delta") == 5 and "transcription.done" in kinds
            done = next(e for e in events if e["type"] == "transcription.done")
            assert done["text"] == "Hello from the fake model." and done["usage"]["prompt_tokens"] == 7
            audio = [e for e in events if e["type"] == "response.audio.delta"]
            assert audio and all(e["format"] == "pcm16" and e["sample_rate_hz"] == 24000 for e in audio)
            assert events[-1] | {"event_id": None} == {"type": "response.audio.done", "has_audio": True,
                                                       "event_id": None}
        ws.send_json({"type": "input_audio_buffer.commit", "final": True})  # nothing appended
        error = ws.receive_json()
        assert error["error"] == "no audio was appended since the last turn"  # the variant's flat error shape
        assert error["code"] == "input_audio_buffer_commit_empty"
    first, second = engine.requests[0][0]["messages"], engine.requests[1][0]["messages"]
    assert first[0]["content"][0]["sample_rate"] == 16000 and len(first[0]["content"][0]["audio"]) == 8000
    assert [m["role"] for m in second] == ["user", "assistant", "user"]  # the second turn hears the first


def test_sessions_keep_their_own_conversations(app_client):
    client, engine = app_client("omni", step_delay=0.05)
    with client.websocket_connect(URL) as one, client.websocket_connect(URL) as two:
        for ws, text in ((one, "From one"), (two, "From two")):
            open_session(ws)
            ws.send_json({"type": "conversation.item.create",
                          "item": {"role": "user", "content": [{"type": "input_text", "text": text}]}})
            until(ws, "conversation.item.done")
        one.send_json({"type": "response.create"})
        two.send_json({"type": "response.create"})  # both answers run at once
        done = [until(ws, "response.done")[-1]["response"] for ws in (one, two)]
    assert [d["status"] for d in done] == ["completed", "completed"] and done[0]["id"] != done[1]["id"]
    prompts = sorted(str(request[0]["messages"]) for request in engine.requests)
    assert "From one" in prompts[0] and "From two" not in prompts[0] and "From one" not in prompts[1]


def test_an_engine_refusal_fails_the_response_and_the_session_goes_on(app_client):
    client, engine = app_client("omni")
    real_generate = engine.generate

    async def too_long(prompt, params=None, request_id=None, **kwargs):
        raise ValueError("prompt: 5000 tokens do not fit max_model_len 4096")
        yield  # an async generator, as AsyncOmni.generate

    engine.generate = too_long
    with client.websocket_connect(URL) as ws:
        open_session(ws)
        ws.send_json({"type": "conversation.item.create",
                      "item": {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}})
        ws.send_json({"type": "response.create"})
        done = until(ws, "response.done")[-1]["response"]
        assert done["status"] == "failed" and "max_model_len" in done["status_details"]["error"]["message"]
        engine.generate = real_generate
        ws.send_json({"type": "response.create"})
        assert until(ws, "response.done")[-1]["response"]["status"] == "completed"
    assert client.app.state.gateway.num_admitted == 0


def test_a_server_bug_fails_the_response_instead_of_leaving_the_session_waiting(app_client):
    client, engine = app_client("omni")
    real_generate = engine.generate

    def broken(*args, **kwargs):  # raises on the call itself, as a wrong signature would
        raise TypeError("generate() got an unexpected keyword argument")

    engine.generate = broken
    with client.websocket_connect(URL) as ws:
        open_session(ws)
        ws.send_json({"type": "conversation.item.create",
                      "item": {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}})
        ws.send_json({"type": "response.create"})
        done = until(ws, "response.done")[-1]["response"]
        assert done["status"] == "failed" and done["status_details"]["error"]["type"] == "server_error"
        engine.generate = real_generate
        ws.send_json({"type": "response.create"})
        assert until(ws, "response.done")[-1]["response"]["status"] == "completed"
    assert client.app.state.gateway.num_admitted == 0

def test_server_vad_drops_silence_between_turns(app_client):
    """A microphone streaming silence never fills the buffer: between turns the server keeps
    only what a next turn's prefix padding may reach back to (the buffer limit here is 3 s)."""
    client, engine = app_client("omni", realtime_max_buffer_s=3)
    silence, voice = np.zeros(2400, np.float32), synthetic_speech(1.0)
    with client.websocket_connect(URL) as ws:
        open_session(ws, {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
            "type": "server_vad", "prefix_padding_ms": 300, "silence_duration_ms": 300}}}}})
        for _ in range(50):  # 5 s of silence
            ws.send_json({"type": "input_audio_buffer.append", "audio": pcm(silence)})
        audio = np.concatenate([voice, np.zeros(12000, np.float32)])
        for i in range(0, len(audio), 2400):
            ws.send_json({"type": "input_audio_buffer.append", "audio": pcm(audio[i:i + 2400])})
        started = until(ws, "input_audio_buffer.speech_started")[-1]
        assert 4500 <= started["audio_start_ms"] <= 5000  # session time still counts the silence
        until(ws, "response.done")
    heard = first_answer_audio(engine)
    assert 0.9 * 24000 <= len(heard) <= 1.8 * 24000


def test_a_turn_is_prefilled_while_spoken_and_its_warm_ups_end_with_a_clear_or_the_session(app_client):
    client, engine = app_client("omni", step_delay=1.0)  # a warm-up (one token) takes a second

    def warm_up(n: int) -> tuple[dict, str]:
        deadline = time.time() + 10
        while time.time() < deadline:
            warms = [(prompt, rid) for prompt, _, rid in engine.requests if rid.startswith("warm_")]
            if len(warms) >= n:
                return warms[n - 1]
            time.sleep(0.02)
        raise AssertionError("no warm-up reached the engine")

    with client.websocket_connect(URL) as ws:
        session_id = open_session(ws)["session"]["id"]
        ws.send_json({"type": "input_audio_buffer.append", "audio": pcm(synthetic_speech(1.2))})
        prompt, first = warm_up(1)
        # Each whole half second is cut as a clip and prefilled, with the rows a spoken answer's talker reads.
        clips = prompt["messages"][-1]["content"]
        assert [len(clip["audio"]) for clip in clips] == [12000, 12000]
        assert prompt["return_hidden_states"] and prompt["return_input_embeds"]
        assert engine.session_ids[-1] == session_id
        ws.send_json({"type": "input_audio_buffer.clear"})
        until(ws, "input_audio_buffer.cleared")
        assert first in engine.aborted  # nobody will answer that audio
        ws.send_json({"type": "input_audio_buffer.append", "audio": pcm(synthetic_speech(1.2))})
        _, second = warm_up(2)
    deadline = time.time() + 10
    while second not in engine.aborted and time.time() < deadline:
        time.sleep(0.02)
    assert second in engine.aborted and client.app.state.gateway.num_admitted == 0  # gone with the session


def test_a_duplex_session_ends_at_a_limit_or_a_stop_with_its_closing_events(app_client):
    """Duplex sessions share the turn-based sessions' socket life (ws_session.EventSession): typed
    client events, the idle limit's error event and close code; a duplex session says how its
    response and session ended before the close."""
    from dataclasses import replace

    from omnistage.config import Duplex

    def duplex_client(**limits):
        client, engine = app_client("omni", **limits)
        engine.spec = replace(engine.spec, duplex=Duplex(24000, 80.0, inputs=lambda audio, final: {"audio": audio},
                                                         params=dict))
        return client

    client = duplex_client(realtime_idle_timeout_s=0.5)
    with client.websocket_connect("/v1/duplex") as ws:
        assert ws.receive_json()["session"]["capabilities"]["duplex"] is True
        until(ws, "response.created")
        ws.send_json({"type": "session.update", "session": {"voice": "Ethan"}, "event_id": "e1"})
        error = ws.receive_json()["error"]
        assert error["param"] == "session.voice" and error["event_id"] == "e1"
        ws.send_json({"type": "input_audio_buffer.commit"})
        assert ws.receive_json()["error"]["param"] == "type"
        events = until(ws, "session.closed")
        assert [e["type"] for e in events] == ["error", "response.done", "session.closed"]
        assert events[0]["error"]["code"] == "idle_timeout" and events[-1]["reason"] == "idle_timeout"
        assert events[1]["response"]["status"] == "cancelled"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1008
    with duplex_client(realtime_max_session_s=0.3).websocket_connect("/v1/duplex") as ws:
        assert until(ws, "session.closed")[-1]["reason"] == "timeout"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1008
    with client.websocket_connect("/v1/duplex") as ws:  # the server stops
        until(ws, "response.created")
        client.portal.call(client.app.state.gateway.drain_after, 0)
        assert until(ws, "session.closed")[-1]["reason"] == "shutdown"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1001


def test_a_turn_is_cut_in_clips_none_longer_than_the_prefilled_ones():
    """Qwen3-Omni pads a request's clips to the longest before their features (its processor's
    way): a last clip longer than the prefilled ones would change their features."""
    from omnistage.entrypoints.openai.realtime.turn_prefill import TurnCuts

    cuts = TurnCuts()
    assert cuts.grow(31200, 24000) and cuts.cuts == [12000, 24000]  # one append of 1.3 s: both whole clips
    turn = np.ones(25200, np.float32)  # 1.05 s: a rest of 50 ms, under a clip's minimum of 100 ms
    audio, final = cuts.final(turn, 24000)
    assert final == (12000, 24000) and len(audio) == 26400 and not audio[25200:].any()  # padded with silence
    assert cuts.final(turn[:24000], 24000)[1] == (12000,)  # a cut at the turn's end cuts no clip
