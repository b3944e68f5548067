"""The load generator: send N requests at a rate, at most C in flight, and time them.

Arrivals follow a Poisson process at `request_rate` requests/s (inf = all at once);
`max_concurrency` caps requests in flight. `warmup` requests (the first prompts, sent one by one) run first and are not counted.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass

import httpx
from tqdm import tqdm

from omnistage.bench.tasks import TASKS, RequestResult, TaskOptions


@dataclass
class BenchConfig:
    base_url: str
    task: str
    prompts: list[dict]
    options: TaskOptions
    max_concurrency: int = 1
    request_rate: float = math.inf
    warmup: int = 1
    api_key: str | None = None
    timeout: float = 600.0
    seed: int = 0
    show_progress: bool = True


@dataclass
class BenchRun:
    results: list[RequestResult]
    duration: float
    config: BenchConfig


async def _run(cfg: BenchConfig) -> BenchRun:
    if cfg.task not in TASKS:
        raise ValueError(f"--task must be one of {sorted(TASKS)}, got {cfg.task!r}")
    send = TASKS[cfg.task]
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=max(cfg.max_concurrency, 1) + 4)
    async with httpx.AsyncClient(base_url=cfg.base_url, headers=headers, timeout=cfg.timeout, limits=limits) as client:
        for row in cfg.prompts[: cfg.warmup]:
            await _safe(send, client, row, cfg.options)

        gate = asyncio.Semaphore(max(cfg.max_concurrency, 1))
        bar = tqdm(total=len(cfg.prompts), desc=f"bench {cfg.task}", disable=not cfg.show_progress, unit="req")
        rng = random.Random(cfg.seed)

        async def one(row: dict) -> RequestResult:
            async with gate:
                result = await _safe(send, client, row, cfg.options)
            bar.update(1)
            return result

        start = time.perf_counter()
        tasks = []
        for row in cfg.prompts:
            tasks.append(asyncio.create_task(one(row)))
            if math.isfinite(cfg.request_rate) and cfg.request_rate > 0:
                await asyncio.sleep(rng.expovariate(cfg.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        bar.close()
    return BenchRun(results=list(results), duration=duration, config=cfg)


async def _safe(send, client, row, options) -> RequestResult:
    t0 = time.perf_counter()
    try:
        return await send(client, row, options)
    except (httpx.HTTPError, ValueError, KeyError) as e:
        return RequestResult(False, time.perf_counter() - t0, error=f"{type(e).__name__}: {e}")


def run_benchmark(cfg: BenchConfig) -> BenchRun:
    return asyncio.run(_run(cfg))
