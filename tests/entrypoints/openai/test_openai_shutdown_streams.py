"""Streams still open when the server stops end with an error the client can read (SSE
`error` in the route's own shape, WebSocket close 1001 with a reason), not a cut body; the
engine requests behind them are aborted. The stop is the gateway's drain, which
`DrainingServer` starts from uvicorn's shutdown."""

from __future__ import annotations

import asyncio
import json

import uvicorn

from omnistage.entrypoints.openai.draining_server import DrainingServer


def drain_soon(http, seconds=0.5):
    http.portal.call(http.app.state.gateway.drain_after, seconds)


def test_an_open_chat_stream_ends_with_an_error_event_and_done(app_client):
    http, engine = app_client("text", step_delay=0.3)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert http.post("/v1/chat/completions", json=chat).status_code == 200  # first-request imports done
    drain_soon(http)
    resp = http.post("/v1/chat/completions", json={**chat, "stream": True})
    assert resp.status_code == 200
    events = [line.removeprefix("data: ") for line in resp.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "server_shutting_down"
    assert len(engine.aborted) == 1


def test_an_open_image_stream_ends_with_an_error_event(app_client):
    http, engine = app_client("image", step_delay=0.3)
    drain_soon(http)
    resp = http.post("/v1/images/generations", json={"prompt": "x", "stream": True, "partial_images": 1})
    assert resp.status_code == 200
    assert resp.text.rstrip().split("\n\n")[-1].startswith("event: error\ndata: ")
    assert "server_shutting_down" in resp.text
    assert len(engine.aborted) == 1


def test_a_non_streamed_request_still_running_is_a_503(app_client):
    http, _ = app_client("image", step_delay=0.5)
    drain_soon(http)
    resp = http.post("/v1/images/generations", json={"prompt": "x"})
    assert resp.status_code == 503 and resp.headers["retry-after"]
    assert resp.json()["error"]["code"] == "server_shutting_down"


def test_a_speech_session_is_closed_with_going_away(app_client):
    http, engine = app_client("tts", step_delay=0.3)
    with http.websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"type": "input.text", "text": "Hello there. How are you?"})
        drain_soon(http)
        while True:
            message = ws.receive()
            if message["type"] == "websocket.close":
                break
    assert message["code"] == 1001 and "shutting down" in message["reason"]


def test_the_server_drains_its_streams_just_before_the_grace_period_ends():
    class Gateway:
        def drain_after(self, seconds):
            self.seconds = seconds

    gateway = Gateway()
    server = DrainingServer(uvicorn.Config(app=None, timeout_graceful_shutdown=30), gateway)
    server.servers, server.force_exit = [], True  # nothing to close, no lifespan to run
    asyncio.run(server.shutdown())
    assert gateway.seconds == 29.0
