"""Step-wise request mode against the whole-loop request mode it replaced, in one script.

Since runtime v2 every engine step is one denoising step in request mode too (live
progress, abort within a step). This measures what that costs: 8 requests (seeds 0-7) of
the zoo's default call (4 steps, CFG on; 64x64 tiny, 256x256 small) on z-image and
qwen-image, one thread, fp32 on CPU:

- whole_loop: the old request mode's body, `pipeline.forward(batch)` (encode, every step,
  decode in one call) on the engine's own loaded pipeline: no scheduler between steps;
- stepwise: `DiffusionEngine` request mode (max_num_seqs=8), one `step()` per denoising step;
- omni: `Omni.generate` over the same 8 prompts (the user's path: orchestrator, stage
  handle, engine).

Each is warmed up once, then timed `--repeats` times interleaved; the best run counts.
Then, on the step-wise engine: the time of a 50-step request's first progress event as a
fraction of its whole run, and the time from `abort` to the engine being idle (its
compute stopped) for a request aborted after 5 of 50 steps. Writes "## Step-wise request
mode" in benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/bench_stepwise.py [--models z-image qwen-image] [--sizes tiny small]
"""

from __future__ import annotations

import argparse
import time

import torch

from bench_diffusion import NUM_REQUESTS, PROMPTS, ROOT, call_kwargs, stage_requests
from common import write_section


def build(model: str, size: str):
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.engine import DiffusionEngine
    from omnistage.testing import ensure

    path = str(ensure(model, size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    return path, DiffusionEngine(path, config=StageDeployConfig(max_num_seqs=NUM_REQUESTS))


def run_stepwise(engine, kwargs: dict) -> None:
    for request in stage_requests(kwargs):
        engine.add_request(request)
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.error is None, out.error


def run_whole_loop(engine, kwargs: dict) -> None:
    from omnistage.diffusion.inputs import to_diffusion_request

    requests = [engine.checker.prepare_request(to_diffusion_request(r, {})) for r in stage_requests(kwargs)]
    engine.executor.worker.runner.pipeline.forward(requests)


def run_omni(omni, kwargs: dict) -> None:
    # One DiffusionParams for all 8 prompts: the seed is the only difference from the others,
    # and per-prompt params are not in Omni.generate yet.
    from omnistage.diffusion.params import DiffusionParams

    fields = {k: v for k, v in kwargs.items() if k in DiffusionParams.model_fields}
    extras = {k: v for k, v in kwargs.items() if k not in DiffusionParams.model_fields}
    results = omni.generate(PROMPTS, DiffusionParams(seed=0, extras=extras, **fields), use_tqdm=False)
    assert all(r.error is None for r in results)


def progress_and_abort(engine, kwargs: dict) -> dict:
    """First progress event / whole run for a 50-step request; abort -> idle after 5 steps."""
    from omnistage.core.types import StageRequest
    from omnistage.diffusion.params import DiffusionParams

    fields = {k: v for k, v in kwargs.items() if k in DiffusionParams.model_fields}
    extras = {k: v for k, v in kwargs.items() if k not in DiffusionParams.model_fields}
    params = DiffusionParams(**{**fields, "num_inference_steps": 50}, seed=1, extras=extras)
    engine.add_request(StageRequest("long", PROMPTS[0], params))
    start, first = time.perf_counter(), None
    while engine.has_unfinished_requests():
        outs = engine.step()
        if first is None and outs:
            first = time.perf_counter() - start
    total = time.perf_counter() - start
    engine.add_request(StageRequest("gone", PROMPTS[0], params))
    steps = 0
    while steps < 5:
        steps += len(engine.step())
    t0 = time.perf_counter()
    engine.abort_request("gone")
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()  # the batch that frees the aborted state on the worker
    return {"first_progress_frac": first / total, "abort_to_idle_s": time.perf_counter() - t0,
            "step_s": total / 50}


def bench(model: str, size: str, repeats: int) -> dict:
    from omnistage import Omni

    kwargs = call_kwargs(model, size)
    path, engine = build(model, size)
    omni = Omni(path, max_num_seqs=NUM_REQUESTS, request_batch_max_wait_ms=50)
    fns = {"whole_loop": lambda: run_whole_loop(engine, kwargs), "stepwise": lambda: run_stepwise(engine, kwargs),
           "omni": lambda: run_omni(omni, kwargs)}
    best = {name: float("inf") for name in fns}
    with torch.inference_mode():
        for fn in fns.values():
            fn()
        for _ in range(repeats):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
        extra = progress_and_abort(engine, kwargs)
    engine.close()
    omni.close()
    return {"model": model, "size": size, "secs": best, **extra}


def table(rows: list[dict]) -> str:
    lines = ["| model | size | whole loop (s) | step-wise (s) | step-wise / whole loop throughput | Omni.generate (s) "
             "| Omni / whole loop throughput | first progress / request | abort -> worker idle | one step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["secs"]
        lines.append(f"| {r['model']} | {r['size']} | {s['whole_loop']:.3f} | {s['stepwise']:.3f} | "
                     f"**{s['whole_loop'] / s['stepwise']:.3f}** | {s['omni']:.3f} | {s['whole_loop'] / s['omni']:.3f} | "
                     f"{r['first_progress_frac']:.3f} | {r['abort_to_idle_s'] * 1000:.1f} ms | "
                     f"{r['step_s'] * 1000:.1f} ms |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["z-image", "qwen-image"])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [bench(model, size, args.repeats) for size in args.sizes for model in args.models]
    body = table(rows) + """

Throughput ratios above 1 mean step-wise is faster. Goal: step-wise >= 0.95x the whole
loop on the small models. "first progress / request": when the first progress event of a
50-step request leaves, as a fraction of its run (1/50 = 0.02 is one step). "abort ->
worker idle": from `abort_request` on a request 5 steps into 50 until the engine holds
nothing and the worker has freed its state. One thread; the whole loop is the old request
mode's `pipeline.forward` on the same loaded pipeline.
"""
    print(body)
    write_section("Step-wise request mode", "benchmarks/bench_stepwise.py", body)


if __name__ == "__main__":
    main()
