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


def record_packed_chunks(engine) -> list[tuple[int, int]]:
    """(cached keys before it, its tokens) of every prompt chunk the engine runs in a packed
    forward from now on."""
    chunks, forward = [], engine.model.forward

    def spy(batch, cache):
        if batch.packed:
            chunks.extend((s, n) for s, n in zip(batch.context_lens, batch.query_lens) if n > 1)
        return forward(batch, cache)

    engine.model.forward = spy
    return chunks


def join_two_long_prompts(engine, short, longs, params, steps=None, **inputs) -> dict:
    """A short stream decodes; two long prompts ("a", "b") join at its third step."""
    from omnistage.ar.sampling_params import SamplingParams
    from omnistage.core.types import StageRequest

    def join(step, eng):
        if steps is not None and eng.has_unfinished_requests():
            steps.append(step)
        if step == 2:
            for name, p in zip("ab", longs):
                eng.add_request(StageRequest(name, {"prompt_token_ids": p, **inputs}, params))

    return run(engine, [StageRequest("s", {"prompt_token_ids": short, **inputs}, SamplingParams(
        max_tokens=24, temperature=0.0))], on_step=join)
