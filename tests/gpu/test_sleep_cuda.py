"""Sleep level 1 on CUDA: the weights leave the device (CUDA memory in use drops by at least
90% of the stage's weights) and come back for an output equal to the one before sleep; the
parked tensors are the module's own (moved in place), so the model is not rebuilt."""

from __future__ import annotations

import asyncio

import torch

from omnistage import SamplingParams
from omnistage.core.parking import torch_modules
from omnistage.entrypoints.omni import AsyncOmni

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def test_sleep_moves_the_weights_off_the_gpu_and_back(zoo):
    async def scenario():
        omni = AsyncOmni(zoo("qwen2-llm"))
        try:
            engine = omni.orchestrator.handles[0].endpoint.server.engine
            params = [p for m in torch_modules(engine.model) for p in m.parameters()]
            weight_bytes = sum(p.numel() * p.element_size() for p in params)
            first = params[0]

            async def run():
                return [out async for out in omni.generate("Hello world!", GREEDY)][-1]

            before = await run()
            torch.cuda.synchronize()
            used = torch.cuda.memory_allocated()
            freed = await omni.sleep(1)
            assert first.device.type == "cpu" and freed >= weight_bytes
            assert used - torch.cuda.memory_allocated() >= 0.9 * weight_bytes
            await omni.wake_up()
            assert first.device.type == "cuda" and params[0] is first
            after = await run()
            assert after.token_ids == before.token_ids
        finally:
            omni.close()

    asyncio.run(scenario())
