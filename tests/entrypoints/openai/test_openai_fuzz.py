"""Fuzzing: schemathesis generates requests from the server's own /openapi.json, against a
real (tiny zoo) image model and a speech model in-process: no 5xx, and every status code
is one the document declares. > 500 requests in all, derandomized so CI is repeatable.

Generated values are kept cheap where they are valid (steps <= 2, short speech text, small
sizes through the server's limits); invalid values go through untouched, so the edge
checks are fuzzed in full."""

from __future__ import annotations

import collections

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import status_code_conformance

from omnistage import AsyncOmni
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread is faster

MODELS = {  # zoo model -> stage overrides keeping each generation to a fraction of a second
    "z-image": {"0": {"default_sampling_params": {"height": 32, "width": 32, "num_inference_steps": 2}}},
    "csm": {"0": {"default_sampling_params": {"max_tokens": 4}}},
}
EXAMPLES = {"POST /v1/audio/speech": 15}  # per operation; the rest get DEFAULT_EXAMPLES
DEFAULT_EXAMPLES = 30
CALLS: collections.Counter = collections.Counter()


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
        failures = {}
        for result in schema.get_all_operations():
            operation = result.ok()

            @settings(max_examples=EXAMPLES.get(operation.label, DEFAULT_EXAMPLES), deadline=None,
                      suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate],
                      database=None, derandomize=True)
            @given(case=operation.as_strategy())
            def call(case):
                keep_cheap(case)
                response = case.call()
                CALLS[model] += 1
                try:
                    case.validate_response(response, checks=(not_a_server_error, status_code_conformance))
                except BaseException as e:  # schemathesis raises an exception group
                    failures.setdefault(operation.label, str(e)[:1500])

            call()
        assert not failures, "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())
    finally:
        engine.close()


def test_the_fuzzing_sent_enough_requests():
    assert sum(CALLS.values()) >= 500, CALLS
