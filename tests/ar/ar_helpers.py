"""Helpers shared by the AR engine tests (fixtures are in conftest.py)."""

from __future__ import annotations

PROMPTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "a photo of a cat",
    "Once upon a time there was a little robot who loved to paint. The sun rises in the east",
]


def make_engine(path: str, **config):
    from omnistage.ar.engine import AREngine
    from omnistage.config.deploy_fields import StageDeployConfig

    return AREngine(path, config=StageDeployConfig(devices=("cpu",), dtype="float32", **config))


def run(engine, requests=(), on_step=None, max_steps=10_000) -> dict:
    """Add `requests`, step until idle; returns {request_id: [StageOutput, ...]}.
    `on_step(step_index, engine)` runs before each step (to add or abort requests mid-flight)."""
    for r in requests:
        engine.add_request(r)
    outputs: dict = {}
    i = 0
    while True:
        if on_step is not None:
            on_step(i, engine)
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        i += 1
        assert i < max_steps, "engine did not finish"
    return outputs


def final(outputs: dict, request_id: str):
    outs = outputs[request_id]
    assert outs[-1].finished and all(not o.finished for o in outs[:-1])
    return outs[-1].payload
