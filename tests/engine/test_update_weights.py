"""Weight updates and sleep level 2 on a real AR stage (the tiny qwen2 LLM, seeds 0 and 1 of
the zoo: same shapes, other weights): an update takes effect exactly at a request boundary (a
request running when it is asked finishes on the old weights, one submitted meanwhile waits
and runs on the new), the new output equals a fresh load of the new checkpoint, and sleep
level 2 frees the weights and reads them back to the same output."""

from __future__ import annotations

import asyncio

import pytest

from omnistage import SamplingParams
from omnistage.core.weights import read_checkpoint
from omnistage.entrypoints.omni import AsyncOmni

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
LONG = GREEDY.replace(max_tokens=48)


@pytest.fixture(scope="module")
def checkpoints(zoo):
    return zoo("qwen2-llm"), zoo("qwen2-llm", seed=1)


@pytest.fixture(scope="module")
def references(checkpoints):
    """What fresh loads of each checkpoint answer: (short, long) token ids per seed."""
    refs = []
    for path in checkpoints:
        omni = AsyncOmni(path)
        try:
            refs.append(asyncio.run(_both(omni)))
        finally:
            omni.close()
    return refs


async def _both(omni):
    return (await generate(omni, "Hello there")).token_ids, (await generate(omni, "a long one", LONG)).token_ids


@pytest.fixture(scope="module")
def omni(checkpoints):
    engine = AsyncOmni(checkpoints[0])
    yield engine
    engine.close()


async def generate(omni: AsyncOmni, prompt: str, params=GREEDY):
    last = None
    async for out in omni.generate(prompt, params):
        last = out
    assert last.error is None, last.error
    return last


def engine_of(omni: AsyncOmni):
    return omni.orchestrator.handles[0].endpoint.server.engine


def test_an_update_lands_between_requests_and_equals_a_fresh_load(omni, checkpoints, references):
    (old_short, old_long), (new_short, new_long) = references
    assert old_short != new_short  # the two checkpoints answer differently

    async def scenario():
        assert (await generate(omni, "Hello there")).token_ids == old_short  # and fills the prefix cache
        running = asyncio.ensure_future(generate(omni, "a long one", LONG))
        await asyncio.sleep(0.02)
        assert omni.orchestrator.has_unfinished_requests()  # the update is asked while it runs
        update = asyncio.ensure_future(omni.update_weights(omni.spec.stages[0].name, checkpoints[1]))
        await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(generate(omni, "Hello there"))  # submitted while the update waits
        num = await update
        return num, (await running).token_ids, (await waiting).token_ids

    num, long_ids, short_ids = asyncio.run(scenario())
    assert num == len(read_checkpoint(checkpoints[1]))
    assert long_ids == old_long  # ran entirely on the old weights
    assert short_ids == new_short  # entirely on the new ones (the old prefix cache was dropped)
    assert asyncio.run(generate(omni, "a long one", LONG)).token_ids == new_long


def test_sleep_level_2_frees_the_weights_and_wakes_to_the_same_output(omni, checkpoints, references):
    new_short = references[1][0]
    params = list(engine_of(omni).model.model.parameters())

    async def scenario():
        before = (await generate(omni, "Hello there")).token_ids
        freed = await omni.sleep(2)
        dropped = sum(p.numel() for p in params)
        await omni.wake_up()
        return before, freed, dropped, (await generate(omni, "Hello there")).token_ids

    before, freed, dropped, after = asyncio.run(scenario())
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    assert dropped == 0 and freed >= weight_bytes  # every weight's storage was freed while asleep
    assert before == after == new_short  # read back from the checkpoint of the last update


def test_an_update_from_tensors_and_the_refusals(omni, checkpoints, references):
    old_short = references[0][0]
    old = read_checkpoint(checkpoints[0])
    asyncio.run(omni.update_weights(0, tensors=old))
    assert asyncio.run(generate(omni, "Hello there")).token_ids == old_short
    with pytest.raises(RuntimeError, match="sleep level 2 reads the weights back from a checkpoint folder"):
        asyncio.run(omni.sleep(2))
    assert not omni.is_sleeping and not omni.orchestrator.paused
    bad = {"model.norm.weight": old["model.norm.weight"], "model.nope": old["model.norm.weight"],
           "lm_head.weight": old["model.norm.weight"]}
    with pytest.raises(ValueError, match=r"1 name\(s\) the stage does not have \(model.nope\) and 1 shape\(s\) "
                                         r"that differ \(lm_head.weight"):
        asyncio.run(omni.update_weights(0, tensors=bad))
    assert asyncio.run(generate(omni, "Hello there")).token_ids == old_short  # nothing was changed
    with pytest.raises(ValueError, match="stage: 'drawer' is not a stage"):
        asyncio.run(omni.update_weights("drawer", checkpoints[1]))
    with pytest.raises(ValueError, match="path: '/nonexistent' is not a folder"):
        asyncio.run(omni.update_weights(0, "/nonexistent"))


def test_post_update_weights_updates_and_names_the_bad_field(omni, checkpoints, references):
    from fastapi.testclient import TestClient

    from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

    http = TestClient(create_app(ServerSettings(served_model_name="llm", model_path=str(checkpoints[0])), omni))
    name = omni.spec.stages[0].name
    resp = http.post("/v1/omni/update_weights", json={"stage": name, "path": str(checkpoints[1])})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"stage": name, "num_tensors": len(read_checkpoint(checkpoints[1]))}
    assert asyncio.run(generate(omni, "Hello there")).token_ids == references[1][0]
    for body, param in (({"stage": "nope", "path": str(checkpoints[0])}, "stage"),
                        ({"stage": 0, "path": "/nonexistent"}, "path"),
                        ({"stage": 0, "path": str(checkpoints[0].parent)}, "path"),  # no safetensors there
                        ({"stage": 0}, "path")):
        resp = http.post("/v1/omni/update_weights", json=body)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
    assert asyncio.run(generate(omni, "Hello there")).token_ids == references[1][0]  # nothing changed
