"""Every answer is OpenAI's JSON error body: uncaught exceptions, middleware failures,
requests cancelled at shutdown, stages that are down (503 + Retry-After); 5xx are logged
with the request id."""

from __future__ import annotations

import asyncio
import json
import logging

from fake_engine import FakeEngine

from omnistage.core.errors import EngineUnavailableError, ErrorKind
from omnistage.engine.outputs import OmniOutput
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

ERROR_FIELDS = {"message", "type", "param", "code"}


def test_an_uncaught_route_exception_is_a_json_500_logged_with_the_request_id(app_client, caplog):
    http, engine = app_client("image")

    async def broken_health():
        raise ZeroDivisionError("oops")

    engine.check_health = broken_health
    with caplog.at_level(logging.ERROR):
        resp = http.get("/health", headers={"x-request-id": "probe-42"})
    assert resp.status_code == 500 and set(resp.json()["error"]) == ERROR_FIELDS
    assert resp.json()["error"]["type"] == "server_error" and "ZeroDivisionError" in resp.json()["error"]["message"]
    assert resp.headers["x-request-id"] == "probe-42"
    assert any("probe-42" in r.getMessage() for r in caplog.records)


def test_a_failing_middleware_still_answers_json(app_client):
    http, _ = app_client("image")

    class Broken:
        api_key = None

        @property
        def max_upload_bytes(self):
            raise RuntimeError("settings went away")

    http.app.state.settings = Broken()
    resp = http.post("/v1/images/generations", json={"prompt": "x"})
    assert resp.status_code == 500 and set(resp.json()["error"]) == ERROR_FIELDS
    assert resp.headers["x-request-id"].startswith("req_")


def test_every_answer_has_a_request_id_and_a_bad_client_id_is_replaced(app_client):
    http, _ = app_client("image")
    assert http.get("/v1/models", headers={"x-request-id": "abc"}).headers["x-request-id"] == "abc"
    assert http.get("/v1/models", headers={"x-request-id": "bad id\twith spaces"}).headers["x-request-id"] != "abc"


def test_an_unavailable_stage_is_503_with_retry_after_and_logged(app_client, caplog):
    http, engine = app_client("image")

    async def down(prompt, params=None, request_id=None, modalities=None, session_id=None):
        yield OmniOutput(request_id, finished=True, finish_reason="error", error_kind=ErrorKind.UNAVAILABLE,
                         error="stage 0 (diffusion): the stage is restarting after: a diffusion worker died")

    engine.generate = down
    with caplog.at_level(logging.ERROR):
        resp = http.post("/v1/images/generations", json={"prompt": "x"})
    assert resp.status_code == 503 and resp.headers["retry-after"].isdigit()
    error = resp.json()["error"]
    assert error["type"] == "service_unavailable_error" and error["code"] == "stage_unavailable"
    assert "restarting" in error["message"]
    assert any(resp.headers["x-request-id"] in r.getMessage() and "503" in r.getMessage() for r in caplog.records)
    assert http.app.state.gateway.num_admitted == 0

    async def closed(prompt, params=None, request_id=None, modalities=None, session_id=None):
        raise EngineUnavailableError("the orchestrator is closed")
        yield  # an async generator, as AsyncOmni.generate

    engine.generate = closed
    resp = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_unavailable"
    assert resp.headers["retry-after"].isdigit()


def test_a_request_cancelled_at_shutdown_gets_a_json_503():
    """uvicorn cancels requests still running when the graceful timeout ends: drive the app
    as uvicorn does and cancel the request while the engine works on it."""
    engine = FakeEngine("image", step_delay=10.0)
    app = create_app(ServerSettings(served_model_name="fake-image", model_path="/m"), engine)
    body = json.dumps({"prompt": "x"}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/images/generations", "raw_path": b"/v1/images/generations",
             "query_string": b"", "root_path": "", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1),
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    sent: list[dict] = []

    async def main() -> None:
        events = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict:
            if events:
                return events.pop()
            await asyncio.sleep(3600)  # the client stays connected
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        task = asyncio.create_task(app(scope, receive, send))
        for _ in range(500):
            if engine.requests:
                break
            await asyncio.sleep(0.01)
        assert engine.requests, "the request never reached the engine"
        task.cancel()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 5)

    asyncio.run(main())
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = dict(start["headers"])
    assert start["status"] == 503 and headers[b"retry-after"].isdigit()
    error = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))["error"]
    assert error["code"] == "server_shutting_down" and set(error) == ERROR_FIELDS
    assert engine.aborted, "the engine request was not aborted"
