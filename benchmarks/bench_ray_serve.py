"""Ray Serve against omnistage's own replicas: the same engine, two copies, the same load.

The zoo's small qwen2-llm (16 greedy tokens a request, one torch thread per copy) served three
ways from one script, on one local Ray cluster this script starts:

- inline: one `AsyncOmni` copy in this process, no Ray (the baseline for per-request overhead);
- ours: `AsyncOmni` with the stage at `runtime: ray`, `num_replicas: 2` (two Ray actors, the
  orchestrator routes by least outstanding work, the supervisor restarts a dead copy);
- serve: a Ray Serve deployment with 2 replicas, each wrapping an inline `AsyncOmni` of the same
  model, called through its `DeploymentHandle` (Python, no HTTP: as `AsyncOmni` is called).

Per way: latency of 8 requests one at a time (median), then throughput (requests/s) with
`--concurrency` requests in flight (`--per-slot` x that many requests a run, after a warm-up
round; best of `--repeats`). What Serve does not do for a multi-stage pipeline is listed beside the table.

`ray[serve]`'s extras (grpcio, aiohttp, ...) are not omnistage dependencies: the script makes a
side venv (`.ray-serve-venv`, seeing the project's venv through a .pth file, so only the extras
are installed there) on its first run and re-runs itself in it. Writes "## Ray Serve vs
replicas" in RESULTS.md.

    .venv/bin/python benchmarks/bench_ray_serve.py [--concurrency 8 32] [--per-slot 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per copy; the Ray workers inherit it
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from common import write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SIDE_VENV = ROOT / ".ray-serve-venv"
MODEL, SIZE, TOKENS = "qwen2-llm", "small", 16
PROMPT = "Tell me a story about a cat"


def reexec_with_serve() -> None:
    """Run this script again in a venv where `ray.serve` imports (made on the first run)."""
    python = SIDE_VENV / "bin" / "python"
    if Path(sys.prefix) == SIDE_VENV:
        raise RuntimeError(f"ray.serve does not import in {SIDE_VENV}: remove it to have it made again")
    if not python.exists():
        subprocess.run([str(Path(sys.base_prefix) / "bin" / "python3"), "-m", "venv", str(SIDE_VENV)], check=True)
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        # The project's venv as a site dir of the side one (its own .pth files, e.g. an editable
        # omnistage, included): pip then sees ray and torch installed and adds only the extras.
        project_site = sysconfig.get_paths()["purelib"]
        Path(site, "project_venv.pth").write_text(f"import site; site.addsitedir({project_site!r})\n")
        import ray

        subprocess.run([str(python), "-m", "pip", "install", "-q", f"ray[serve]=={ray.__version__}"], check=True)
    os.execv(str(python), [str(python), *sys.argv])


def params():
    from omnistage import SamplingParams

    return SamplingParams(max_tokens=TOKENS, temperature=0, ignore_eos=True)


async def run_one(omni, prompt: str) -> list[int]:
    last = None
    async for out in omni.generate(prompt, params()):
        last = out
    assert last.error is None, last.error
    return list(last.token_ids)


class Copy:
    """A Ray Serve replica: an inline AsyncOmni of the model (what each of our copies holds too)."""

    def __init__(self, path: str):
        import torch

        from omnistage.entrypoints.omni import AsyncOmni

        torch.set_num_threads(1)
        self.omni = AsyncOmni(path)

    async def generate(self, prompt: str) -> list[int]:
        return await run_one(self.omni, prompt)


async def measure(call, concurrency: list[int], per_slot: int, repeats: int) -> dict:
    """call(prompt) -> awaitable token ids. Latency one at a time, then throughput per level."""
    await asyncio.gather(*(call(f"{PROMPT} warm {i}") for i in range(8)))
    latencies = []
    for i in range(8):
        started = time.perf_counter()
        await call(f"{PROMPT} {i}")
        latencies.append(time.perf_counter() - started)
    out = {"latency": sorted(latencies)[len(latencies) // 2], "throughput": {}, "reference": await call(PROMPT)}
    for n in concurrency:
        best = float("inf")
        for r in range(repeats):
            pending = [f"{PROMPT} {r} {i}" for i in range(per_slot * n)]

            async def worker():
                while pending:
                    await call(pending.pop())

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(n)))
            best = min(best, time.perf_counter() - started)
        out["throughput"][n] = per_slot * n / best
        print(f"  {n} in flight: {out['throughput'][n]:.2f} req/s", flush=True)
    return out


def bench(concurrency: list[int], per_slot: int, repeats: int) -> dict:
    import ray
    from ray import serve

    from omnistage.entrypoints.omni import AsyncOmni
    from omnistage.runtime.ray import propagated_env
    from omnistage.testing import ensure

    path = str(ensure(MODEL, size=SIZE, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    results = {}
    print("inline", flush=True)
    omni = AsyncOmni(path)
    try:
        results["inline"] = asyncio.run(measure(lambda p: run_one(omni, p), concurrency, per_slot, repeats))
    finally:
        omni.close()
    # A Ray of its own ("local"), not one another job on this machine started.
    ray.init(address="local", num_cpus=4, include_dashboard=False, configure_logging=False,
             runtime_env={"env_vars": propagated_env()})
    try:
        print("ours: runtime ray, 2 replicas", flush=True)
        omni = AsyncOmni(path, stage_overrides={"0": {"runtime": "ray", "num_replicas": 2}})
        try:
            results["ours"] = asyncio.run(measure(lambda p: run_one(omni, p), concurrency, per_slot, repeats))
        finally:
            omni.close()
        print("ray serve: 2 replicas", flush=True)
        serve.start(http_options={"location": "NoServer"})
        app = serve.deployment(Copy, num_replicas=2, ray_actor_options={"num_cpus": 1},
                               max_ongoing_requests=max(concurrency)).bind(path)
        handle = serve.run(app, name="omnistage", route_prefix=None)

        async def call(prompt):
            return await handle.generate.remote(prompt)

        results["serve"] = asyncio.run(measure(call, concurrency, per_slot, repeats))
        serve.shutdown()
    finally:
        ray.shutdown()
    same = results["ours"]["reference"] == results["serve"]["reference"] == results["inline"]["reference"]
    return {"ways": results, "same": same}


def table(results: dict, concurrency: list[int], per_slot: int, repeats: int, loads: tuple) -> str:
    ways = results["ways"]
    head = "| Way | Latency, one at a time (ms, median) | " + " | ".join(
        f"{n} in flight (req/s)" for n in concurrency) + " |"
    rows = [head, "|" + "---|" * (2 + len(concurrency))]
    names = {"inline": "inline, 1 copy, no Ray (baseline)", "ours": "omnistage replicas: runtime ray, 2 copies",
             "serve": "Ray Serve deployment, 2 replicas"}
    for way, label in names.items():
        r = ways[way]
        rows.append(f"| {label} | {r['latency'] * 1e3:.0f} | " + " | ".join(
            f"{r['throughput'][n]:.2f}" for n in concurrency) + " |")
    ratios = ", ".join(f"{n} in flight {ways['serve']['throughput'][n] / ways['ours']['throughput'][n]:.2f}x"
                       for n in concurrency)
    note = (f"Serve over ours, throughput: {ratios}; latency one at a time: "
            f"{ways['serve']['latency'] / ways['ours']['latency']:.2f}x. Same tokens on all three ways: "
            f"{'yes' if results['same'] else '**no**'}. {MODEL} {SIZE}, {TOKENS} greedy tokens a request ({per_slot} per "
            f"request in flight a run, best of {repeats}), one torch "
            f"thread a copy, a local Ray of 4 logical CPUs on {os.cpu_count()} cores shared with other jobs; load "
            f"average (1 min) at the start and the end: {loads[0]:.1f} / {loads[1]:.1f}.")
    return "\n".join(rows) + "\n\n" + note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--per-slot", type=int, default=8, help="requests a run per request in flight")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    try:
        importlib.import_module("ray.serve")
    except ImportError:
        reexec_with_serve()
    load_start = os.getloadavg()[0]
    results = bench(args.concurrency, args.per_slot, args.repeats)
    text = table(results, args.concurrency, args.per_slot, args.repeats, (load_start, os.getloadavg()[0]))
    print(text)
    if not args.no_write:
        write_section("Ray Serve vs replicas", "benchmarks/bench_ray_serve.py", text)


if __name__ == "__main__":
    main()
