"""Sleep level 2 gives the weights' memory back to the OS (Linux): a `runtime: process` stage of
the small qwen2 LLM (30 MiB of fp32 weights, 32 MiB with the packed copy of its tied LM head)
shrinks its resident memory by at least 90% of the bytes the engine dropped, and wakes to the
same output. Its weights live in two kinds of memory, and both must go: the packed CPU linears
are heap copies (anonymous memory: glibc keeps them unless trimmed), the other tensors are
views of the checkpoint file's mapping (which stays resident while any view, e.g. a packed
layer's bias, is alive). Measured from level 1 to level 2, so the allocator's garbage from
the generation (freed by level 1 already) is not counted."""

from __future__ import annotations

import asyncio
import sys

import psutil
import pytest

from omnistage import SamplingParams
from omnistage.core.cpu_linear import MIN_PACKED_WEIGHT, PACKED_FOR_ROWS, packable_dtypes
from omnistage.core.weights import read_checkpoint
from omnistage.entrypoints.omni import AsyncOmni

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim, /proc maps")

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


async def generate(omni: AsyncOmni, prompt: str) -> list[int]:
    last = None
    async for out in omni.generate(prompt, GREEDY):
        last = out
    assert last.error is None, last.error
    return last.token_ids


def anonymous_rss(pid: int) -> int:
    """The process's resident anonymous memory (heap, not file pages), bytes."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))


def packed_bytes(path) -> int:
    """Bytes of the stage's packed copies: every 2-D weight of at least MIN_PACKED_WEIGHT elements for a
    batched stage (llm.yaml's max_num_seqs: 8): the linears, and the embedding, which the tied LM head
    packs a copy of."""
    return sum(t.nbytes for t in read_checkpoint(path).values()
               if t.dim() == 2 and t.numel() >= MIN_PACKED_WEIGHT[PACKED_FOR_ROWS] and t.dtype in packable_dtypes())


def test_sleep_level_2_returns_the_weights_memory_and_wakes_to_the_same_output(zoo):
    path = zoo("qwen2-llm", size="small")
    omni = AsyncOmni(path, stage_overrides={"0": {"runtime": "process"}})
    try:
        stage = psutil.Process(omni.orchestrator.handles[0].endpoint.pid)

        def mapped_checkpoint() -> list[str]:
            return [m.path for m in stage.memory_maps() if m.path.endswith(".safetensors")]

        async def scenario():
            before = await generate(omni, "Hello there")
            kv = await omni.sleep(1)  # on CPU: the KV pools, and the allocator's free pages
            asleep_1, anon_1 = stage.memory_info().rss, anonymous_rss(stage.pid)
            await omni.wake_up()
            freed = await omni.sleep(2)
            asleep_2, anon_2, maps = stage.memory_info().rss, anonymous_rss(stage.pid), mapped_checkpoint()
            await omni.wake_up()
            after = await generate(omni, "Hello there")
            return before, after, freed - kv, asleep_1 - asleep_2, anon_1 - anon_2, maps

        before, after, weight_bytes, rss_freed, anon_freed, maps = asyncio.run(scenario())
    finally:
        omni.close()
    assert weight_bytes >= 30 * 2**20  # the checkpoint's fp32 tensors and the packed LM head
    assert rss_freed >= 0.9 * weight_bytes, (rss_freed / 2**20, weight_bytes / 2**20)
    assert anon_freed >= 0.9 * packed_bytes(path), (anon_freed / 2**20, packed_bytes(path) / 2**20)
    assert maps == []  # no view of the checkpoint's mapping is left
    assert before == after
