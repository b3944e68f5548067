"""Fuzzing: schemathesis generates requests from the server's own /openapi.json, against a
real (tiny zoo) image model and a speech model in-process: no 5xx, every status code is
one the document declares, and the process's memory stays within `MAX_RSS_GROWTH` of what
it was before the first request. The WebSocket route (not in the document) gets sessions of
generated messages. > 500 requests in all, derandomized so CI is repeatable; the routes a
model serves get the most of them (`max_examples`).

Generated values are kept cheap where they are valid (steps <= 2, short speech text, small
sizes through the server's limits); invalid values go through untouched, so the edge
checks are fuzzed in full."""

from __future__ import annotations

import collections
import json

import psutil
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import status_code_conformance

from omnistage import AsyncOmni
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread is faster

MODELS = {  # zoo model -> stage overrides keeping each generation to a fraction of a second
    "z-image": {"0": {"default_sampling_params": {"height": 32, "width": 32, "num_inference_steps": 2}}},
    "csm": {"0": {"default_sampling_params": {"max_tokens": 4}}},
}
EXAMPLES = {"POST /v1/audio/speech": 15}  # per operation the model serves; the rest get DEFAULT_EXAMPLES
DEFAULT_EXAMPLES = 30
OTHER_EXAMPLES = 10
"""Per operation outside the routes the model serves (refused routes, and those of no model:
health, files, voices, sleep): both models get these operations with the same derandomized
inputs, so each gets a third of the examples (most of the fuzzing's time is generating them)."""
WS_SESSIONS = 25
MAX_RSS_GROWTH = 1 << 30
"""The issue's bound: under 1 GB above idle, whatever the accepted input (tiny zoo models)."""
CALLS: collections.Counter = collections.Counter()
PEAK_RSS_GROWTH: dict[str, int] = {}


def max_examples(operation, served_routes: list[str]) -> int:
    if any(operation.path.startswith(route.split()[-1]) for route in served_routes):  # e.g. its /batch too
        return EXAMPLES.get(operation.label, DEFAULT_EXAMPLES)
    return OTHER_EXAMPLES


def keep_cheap(case) -> None:
    body = case.body
    if not isinstance(body, dict):
        return
    steps = body.get("num_inference_steps")
    if isinstance(steps, (int, float)) and not isinstance(steps, bool) and 2 < steps <= 1000:
        body["num_inference_steps"] = 2
    text = body.get("input")
    if isinstance(text, str) and 12 < len(text) <= 4096:
        body["input"] = text[:12]


@pytest.mark.parametrize("model", list(MODELS))
def test_fuzz_the_openapi_document(zoo, model):
    engine = AsyncOmni(zoo(model), stage_overrides=MODELS[model])
    try:
        app = create_app(ServerSettings(served_model_name=model, model_path=str(zoo(model)), max_pixels=64 * 64,
                                        max_n=2), engine)
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        process = psutil.Process()
        idle = process.memory_info().rss
        failures = {}
        for result in schema.get_all_operations():
            operation = result.ok()

            @settings(max_examples=max_examples(operation, app.state.capabilities.routes), deadline=None,
                      suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate],
                      database=None, derandomize=True)
            @given(case=operation.as_strategy())
            def call(case):
                keep_cheap(case)
                response = case.call()
                CALLS[model] += 1
                growth = process.memory_info().rss - idle
                PEAK_RSS_GROWTH[model] = max(PEAK_RSS_GROWTH.get(model, 0), growth)
                if growth > MAX_RSS_GROWTH:
                    failures.setdefault("rss", f"{case.method} {case.path} {case.body!r:.300}: RSS {growth >> 20} MB "
                                               "above idle")
                try:
                    case.validate_response(response, checks=(not_a_server_error, status_code_conformance))
                except BaseException as e:  # schemathesis raises an exception group
                    failures.setdefault(operation.label, str(e)[:1500])

            call()
        if app.state.capabilities.serves("audio.speech"):
            failures.update(fuzz_speech_sessions(app, model))
        assert not failures, "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())
    finally:
        engine.close()


def test_the_fuzzing_sent_enough_requests():
    assert sum(CALLS.values()) >= 500, CALLS
    print(f"requests fuzzed: {dict(CALLS)}; peak RSS above idle (MB): "
          f"{ {m: g >> 20 for m, g in PEAK_RSS_GROWTH.items()} }")


_TEXT = st.text(max_size=40)
_MESSAGES = st.one_of(
    st.fixed_dictionaries({"type": st.just("session.config")},
                          optional={"voice": _TEXT, "response_format": _TEXT, "speed": st.floats(allow_nan=False),
                                    "model": _TEXT, "instructions": _TEXT}),
    st.fixed_dictionaries({"type": st.just("input.text"), "text": _TEXT}),
    st.dictionaries(_TEXT, st.recursive(st.none() | st.booleans() | st.integers() | _TEXT,
                                        lambda inner: st.lists(inner, max_size=3), max_leaves=5), max_size=3),
    _TEXT.map(lambda t: ("raw", t)),
    st.binary(max_size=16),
)


def fuzz_speech_sessions(app, model: str) -> dict[str, str]:
    """Sessions of generated messages, each ended by input.done: the session must end with
    session.done and a normal close (an error event per bad message), never a server error."""
    failures: dict[str, str] = {}
    http = TestClient(app)

    @settings(max_examples=WS_SESSIONS, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.generate], database=None, derandomize=True)
    @given(messages=st.lists(_MESSAGES, max_size=4))
    def session(messages):
        with http.websocket_connect("/v1/audio/speech/stream") as ws:
            for message in messages:
                if isinstance(message, bytes):
                    ws.send_bytes(message)
                elif isinstance(message, tuple):
                    ws.send_text(message[1])
                else:
                    ws.send_text(json.dumps(message))
            ws.send_json({"type": "input.done"})
            CALLS[f"{model} websocket"] += 1
            while True:
                event = ws.receive()
                if event["type"] == "websocket.close":
                    failures.setdefault("websocket", f"{messages!r:.300}: closed early ({event})")
                    return
                if event.get("text") and json.loads(event["text"]).get("type") == "session.done":
                    return

    session()
    return failures
