"""Sleep level 1 on a real AR stage (the tiny qwen2 LLM on CPU): sleeping frees the KV pools
and refuses new requests as unavailable until woken; the output after waking equals the
output before; a request running when sleep is asked finishes first; an unknown level is
refused naming `level`. (Weights leave the device only on an accelerator: tests/gpu.)"""

from __future__ import annotations

import asyncio

import pytest

from omnistage import SamplingParams
from omnistage.core.errors import EngineUnavailableError
from omnistage.entrypoints.omni import AsyncOmni

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def omni(zoo):
    engine = AsyncOmni(zoo("qwen2-llm"))
    yield engine
    engine.close()


async def generate(omni: AsyncOmni, prompt: str, params=GREEDY):
    last = None
    async for out in omni.generate(prompt, params):
        last = out
    return last


def kv_bytes(omni: AsyncOmni) -> int:
    return omni.orchestrator.handles[0].endpoint.server.engine.runner.cache.num_bytes


def test_sleep_frees_the_kv_pools_refuses_requests_and_wakes_to_the_same_output(omni):
    async def scenario():
        before = await generate(omni, "Hello there")
        assert before.error is None and kv_bytes(omni) > 0
        # Asked while a long request runs: that request finishes before the stage sleeps.
        running = asyncio.ensure_future(generate(omni, "a long one", GREEDY.replace(max_tokens=64)))
        await asyncio.sleep(0.05)
        freed = await omni.sleep(1)
        long_one = await running
        assert long_one.error is None and len(long_one.token_ids) == 64
        assert omni.is_sleeping and freed > 0 and kv_bytes(omni) == 0
        with pytest.raises(EngineUnavailableError, match="asleep"):
            await generate(omni, "Hello there")
        await omni.wake_up()
        after = await generate(omni, "Hello there")
        assert not omni.is_sleeping and after.token_ids == before.token_ids and after.text == before.text

    asyncio.run(scenario())


def test_an_unknown_sleep_level_is_refused_naming_the_field(omni):
    with pytest.raises(ValueError, match="level: 3 is not a sleep level"):
        asyncio.run(omni.sleep(3))
    assert not omni.is_sleeping and not omni.orchestrator.paused
