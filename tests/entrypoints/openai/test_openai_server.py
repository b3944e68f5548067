"""Server-wide behaviour over a fake engine: health, models, metrics, auth, limits, errors."""

from __future__ import annotations

import threading

import openai
import pytest


def test_health_models_and_metrics(app_client):
    http, engine = app_client("image")
    assert http.get("/health").json() == {"status": "ok"}
    engine.healthy = False
    assert http.get("/health").status_code == 503
    engine.healthy = True

    models = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http).models.list()
    assert [m.id for m in models.data] == ["fake-image"]
    assert http.get("/v1/models").json()["data"][0]["routes"] == [
        "POST /v1/images/generations", "POST /v1/images/edits", "POST /v1/chat/completions", "/v1/responses"]

    assert http.post("/v1/images/generations", json={"prompt": "x"}).status_code == 200
    assert http.post("/v1/images/generations", json={"prompt": "x", "size": "no"}).status_code == 400
    text = http.get("/metrics").text
    assert 'omnistage_http_requests_total{method="POST",route="/v1/images/generations",status="200"} 1.0' in text
    assert 'omnistage_http_requests_total{method="POST",route="/v1/images/generations",status="400"} 1.0' in text
    assert "omnistage_http_request_duration_seconds_bucket" in text
    assert "omnistage_queue_depth 0.0" in text


def test_api_key_guards_every_v1_route(app_client):
    http, _ = app_client("image", api_key="s3cret")
    resp = http.get("/v1/models")
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    assert http.post("/v1/images/generations", json={"prompt": "x"},
                     headers={"authorization": "Bearer wrong"}).status_code == 401
    assert http.post("/v1/videos", data={"prompt": "x"}).status_code == 401
    assert http.get("/health").status_code == 200  # probes need no key
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url="http://testserver/v1", api_key="nope", http_client=http, max_retries=0).models.list()
    good = openai.OpenAI(base_url="http://testserver/v1", api_key="s3cret", http_client=http)
    assert good.images.generate(prompt="x").data[0].b64_json
    # Two Authorization headers (the good key among them) are refused, not one of them picked.
    twice = http.get("/v1/models", headers=[("authorization", "Bearer s3cret"), ("authorization", "Bearer x")])
    assert twice.status_code == 400 and twice.json()["error"]["param"] == "authorization"


def test_unknown_routes_and_methods_use_openai_errors(app_client):
    http, _ = app_client("image")
    resp = http.get("/v1/nothing")
    assert resp.status_code == 404 and set(resp.json()["error"]) == {"message", "type", "param", "code"}
    resp = http.get("/v1/images/generations")
    assert resp.status_code == 405 and "error" in resp.json()


def test_queue_limit_answers_429_and_frees_slots(app_client):
    http, engine = app_client("image", max_queued_requests=1, step_delay=0.2)
    results = []
    first = threading.Thread(target=lambda: results.append(http.post("/v1/images/generations", json={"prompt": "a"})))
    first.start()
    import time

    deadline = time.time() + 5
    while not engine.requests and time.time() < deadline:
        time.sleep(0.01)
    resp = http.post("/v1/images/generations", json={"prompt": "b"})
    assert resp.status_code == 429 and resp.json()["error"]["type"] == "rate_limit_error"
    first.join()
    assert results[0].status_code == 200
    assert http.post("/v1/images/generations", json={"prompt": "c"}).status_code == 200
    assert http.app.state.gateway.num_admitted == 0


def test_engine_rejection_is_400_and_engine_failure_is_500(app_client):
    http, engine = app_client("image")
    resp = http.post("/v1/images/generations", json={"prompt": "x", "max_sequence_length": 9999})
    assert resp.status_code == 400 and "max_sequence_length" in resp.json()["error"]["message"]

    async def broken(prompt, params=None, request_id=None, modalities=None, session_id=None):
        from omnistage.engine.outputs import OmniOutput

        yield OmniOutput(request_id, finished=True, finish_reason="error", error="stage 0 (diffusion): boom")

    engine.generate = broken
    resp = http.post("/v1/images/generations", json={"prompt": "x"})
    assert resp.status_code == 500
    assert resp.json()["error"]["type"] == "server_error" and "boom" in resp.json()["error"]["message"]
    assert http.app.state.gateway.num_admitted == 0


def test_lifespan_shuts_the_engine_down_and_removes_files():
    from fake_engine import make_client

    http, engine = make_client("image")
    with http:
        resp = http.post("/v1/images/generations", json={"prompt": "x", "response_format": "url"})
        assert resp.status_code == 200
        directory = http.app.state.files.directory
        assert any(directory.iterdir())
    assert engine.is_shut_down and not directory.exists()


def test_api_key_covers_the_docs_unless_public_and_metrics_when_protected(app_client):
    http, _ = app_client("image", api_key="k")
    key = {"authorization": "Bearer k"}
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert http.get(path).status_code == 401, path
        assert http.get(path, headers=key).status_code == 200, path
    assert http.get("/metrics").status_code == 200

    http, _ = app_client("image", api_key="k", public_docs=True, protect_metrics=True)
    assert http.get("/openapi.json").status_code == 200 and http.get("/docs").status_code == 200
    assert http.get("/metrics").status_code == 401
    assert http.get("/metrics", headers={"authorization": "Bearer k"}).status_code == 200
    assert http.get("/health").status_code == 200


def test_openapi_lists_the_statuses_and_streams_each_route_answers(app_client):
    http, _ = app_client("text", max_upload_bytes=100)
    doc = http.get("/openapi.json").json()
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert sorted(chat) == ["200", "400", "401", "404", "413", "415", "429", "500", "503"]
    assert set(chat["200"]["content"]) == {"application/json", "text/event-stream"}
    assert chat["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    speech = doc["paths"]["/v1/audio/speech"]["post"]["responses"]["200"]["content"]
    assert {"audio/aac", "audio/mpeg", "text/event-stream"} <= set(speech)
    assert "/v1/completions" in doc["paths"]
    assert not any("422" in op["responses"] for ops in doc["paths"].values() for op in ops.values())
    # The documented codes are real answers of the chat route.
    body = {"messages": [{"role": "user", "content": "x"}]}
    assert http.post("/v1/chat/completions", json={**body, "n": 0}).status_code == 400
    assert http.post("/v1/chat/completions", json={**body, "model": "other"}).status_code == 404
    assert http.post("/v1/chat/completions", content=b"x" * 200,
                     headers={"content-type": "application/json"}).status_code == 413
    assert http.post("/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain"}).status_code == 415
