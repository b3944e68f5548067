"""Executors side by side: the same 8-request image workload on `uni`, `mp` and `ray`, in one script.

bench_diffusion.py's workload (8 prompts, seeds 0-7, the zoo's default call: 4 steps, CFG,
64x64 on tiny) through `DiffusionEngine` (the user's path), one device each:

- uni: the worker in this process (the baseline);
- mp: one spawned worker process, results over shared memory;
- ray: one Ray actor on a local Ray this script starts (or $RAY_ADDRESS), results through Ray.

Two batchings: all 8 in one batch (max_num_seqs=8: a few calls for the whole workload) and
one at a time (max_num_seqs=1: 8 batches, one executor call per batch). Every engine runs
one torch thread (OMP_NUM_THREADS=1, which the workers inherit), so the executors differ
only in how a call reaches the worker. Each is warmed up once, then timed `--repeats`
times interleaved; the best run counts. Overhead per request = (executor - uni) / 8.
Prints markdown and writes "## Ray executor" in RESULTS.md.

    .venv/bin/python benchmarks/bench_ray.py [--model z-image] [--size tiny] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per worker; the workers inherit it
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402

from bench_diffusion import NUM_REQUESTS, ROOT, call_kwargs, run_ours  # noqa: E402
from common import write_section  # noqa: E402

EXECUTORS = ("uni", "mp", "ray")
BATCHINGS = {"8 in one batch": 8, "one at a time": 1}


def bench(model: str, size: str, repeats: int) -> dict:
    import torch

    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.engine import DiffusionEngine
    from omnistage.runtime import ray as ray_utils
    from omnistage.testing import ensure

    torch.set_num_threads(1)
    ray_utils.ensure_ray()
    path = str(ensure(model, size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    kwargs = call_kwargs(model, size)
    engines = {(executor, batching): DiffusionEngine(path, config=StageDeployConfig(executor=executor,
                                                                                   max_num_seqs=seqs))
               for executor in EXECUTORS for batching, seqs in BATCHINGS.items()}
    best = {key: float("inf") for key in engines}
    images = {}
    try:
        with torch.inference_mode():
            for key, engine in engines.items():  # warm-up
                images[key] = run_ours(engine, kwargs)
            for _ in range(repeats):
                for key, engine in engines.items():
                    start = time.perf_counter()
                    images[key] = run_ours(engine, kwargs)
                    best[key] = min(best[key], time.perf_counter() - start)
    finally:
        for engine in engines.values():
            engine.close()
    diff = max(int(np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max())
               for key in engines for a, b in zip(images[key], images[("uni", key[1])]))
    return {"model": model, "size": size, "secs": best, "max_pixel_diff": diff}


def markdown(result: dict) -> str:
    secs = result["secs"]
    rows = ["| batching | executor | 8 requests (s) | vs uni | overhead per request (ms) |",
            "|---|---|---|---|---|"]
    for batching in BATCHINGS:
        uni = secs[("uni", batching)]
        for executor in EXECUTORS:
            t = secs[(executor, batching)]
            rows.append(f"| {batching} | {executor} | {t:.3f} | {t / uni:.2f}x | "
                        f"{(t - uni) / NUM_REQUESTS * 1000:+.1f} |")
    return (f"{result['model']} {result['size']}, 8 requests, 1 torch thread per worker; the best of the "
            f"runs. Largest pixel difference against uni: {result['max_pixel_diff']}.\n\n" + "\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="z-image")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    body = markdown(bench(args.model, args.size, args.repeats))
    print(body)
    if not args.no_write:
        note = ("Taken on a shared, loaded 2-core machine (other engineers' tests running): the ratios "
                "are indicative, the absolute times are not. Every denoising step is one executor call, so "
                "one at a time (8 x 4 steps) shows the cost per call; the `mp` row pays a shared-memory "
                "segment per reply, `ray` Ray's own transport.\n\n")
        write_section("Ray executor", "benchmarks/bench_ray.py", note + body)


if __name__ == "__main__":
    main()
