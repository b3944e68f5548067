"""Diffusion engine throughput and latency vs diffusers' own pipelines, in one script.

8 requests (8 prompts, seeds 0-7), the zoo's default call for each family (4 steps,
CFG on, 64x64 on tiny, 256x256 on small), on the zoo's z-image and qwen-image, fp32 on CPU
unless `--device` / `--dtype` say otherwise (both sides always share them):

- ours: `DiffusionEngine` request mode, max_num_seqs=8, all 8 submitted at once;
- sequential: the diffusers pipeline called 8 times, one prompt and generator each;
- batched: one diffusers call with the 8 prompts and 8 generators (the fixed-batch ceiling);
- staggered arrivals (request i arrives at i * gap, gap = a quarter of one request's
  latency): mean latency of step mode (requests join between steps) against request
  mode (a batch runs to the end before the next one starts), both max_num_seqs=8.

Each is warmed up once, then timed `--repeats` times interleaved in one process; the best
run (and the best mean latency) counts. Peak RSS per configuration comes from a separate short process per
configuration (load + one run), sampled with psutil. Prints markdown tables and writes
them under "## Diffusion" in benchmarks/RESULTS.md (other sections are kept).

    .venv/bin/python benchmarks/bench_diffusion.py [--models z-image qwen-image] [--sizes tiny small]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from common import add_device_args, synchronize, torch_dtype, write_section

ROOT = Path(__file__).resolve().parent.parent
NUM_REQUESTS = 8
PROMPTS = [
    "a cat",
    "a photo of a small dog sitting on a long red wooden chair",
    "a tree in the snow at night",
    "an astronaut riding a horse on the moon, highly detailed",
    "a bowl of fruit",
    "a watercolor painting of a mountain lake at sunrise with mist over the water",
    "a red bicycle",
    "a lighthouse on a rocky coast during a storm",
]
CONFIGS = ("ours", "sequential", "batched", "step_staggered", "request_staggered")


# -- inputs ------------------------------------------------------------------------------


OMNI_MODELS = ("glm-image",)
"""Pipelines of more than one stage (GLM-Image: AR prior -> DiT): "ours" runs them through
`Omni.generate`, both stages batching; the staggered rows are left out for them."""


def default_call(model: str) -> dict:
    from omnistage.testing.diffusion_models import DEFAULT_CALL_KWARGS

    if model == "glm-image":
        from omnistage.testing.glm_image_models import DEFAULT_CALL_KWARGS as GLM_CALL

        return GLM_CALL
    return DEFAULT_CALL_KWARGS[model]


def call_kwargs(model: str, size: str) -> dict:
    from omnistage.testing.diffusion_models import IMAGE_SIDE

    kwargs = dict(default_call(model))
    kwargs["height"] = kwargs["width"] = IMAGE_SIDE[size]
    kwargs.pop("prompt")
    return kwargs


def stage_requests(kwargs: dict, prefix: str = "r") -> list:
    """The same inputs as `kwargs` + PROMPTS + seeds, as engine requests."""
    from omnistage.diffusion.params import DiffusionParams
    from omnistage.engine.types import StageRequest

    fields = {k: v for k, v in kwargs.items() if k in DiffusionParams.model_fields}
    extras = {k: v for k, v in kwargs.items() if k not in DiffusionParams.model_fields}
    return [StageRequest(f"{prefix}{i}", prompt, DiffusionParams(seed=i, extras=extras, **fields))
            for i, prompt in enumerate(PROMPTS)]


def generator(seed: int) -> torch.Generator:
    return torch.Generator("cpu").manual_seed(seed)


# -- the runs ----------------------------------------------------------------------------


def run_ours(engine, kwargs: dict) -> list:
    for request in stage_requests(kwargs):
        engine.add_request(request)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                assert out.error is None, out.error
                done[out.request_id] = out.payload.images[0]
    return [done[f"r{i}"] for i in range(NUM_REQUESTS)]


def run_omni(omni, kwargs: dict) -> list:
    """All 8 prompts through `Omni.generate` at once (every stage of the pipeline)."""
    params = [request.params for request in stage_requests(kwargs)]
    return [out.images[0] for out in omni.generate(PROMPTS, params, use_tqdm=False)]


def run_sequential(pipe, kwargs: dict) -> list:
    return [pipe(prompt=p, **kwargs, generator=generator(i)).images[0] for i, p in enumerate(PROMPTS)]


def run_batched(pipe, kwargs: dict) -> list:
    kwargs = dict(kwargs)
    negative = kwargs.pop("negative_prompt", None)
    if negative is not None:  # (GlmImagePipeline takes none)
        kwargs["negative_prompt"] = [negative] * NUM_REQUESTS
    return pipe(prompt=PROMPTS, **kwargs,
                generator=[generator(i) for i in range(NUM_REQUESTS)]).images


def run_staggered(engine, kwargs: dict, gap: float) -> float:
    """Request i arrives at i * gap; returns the mean latency from arrival to final output."""
    pending = stage_requests(kwargs)
    start, finish = time.perf_counter(), {}
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while pending and int(pending[0].request_id[1:]) * gap <= now:
            engine.add_request(pending.pop(0))
        if engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finish[int(out.request_id[1:])] = time.perf_counter() - start
        elif pending:
            time.sleep(max(0.0, int(pending[0].request_id[1:]) * gap - now))
    return float(np.mean([finish[i] - i * gap for i in range(NUM_REQUESTS)]))


def build(model: str, size: str, configs: tuple[str, ...], device: str = "cpu", dtype: str = "float32") -> dict:
    """What `configs` need: the diffusers pipeline and / or our engines, all on `device` in `dtype`."""
    from diffusers import DiffusionPipeline

    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.engine import DiffusionEngine
    from omnistage.testing import ensure

    path = str(ensure(model, size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    built = {"path": path}
    if {"sequential", "batched"} & set(configs):
        pipe = DiffusionPipeline.from_pretrained(path, dtype=torch_dtype(dtype)).to(device)
        pipe.set_progress_bar_config(disable=True)
        built["pipe"] = pipe
    engine_config = dict(max_num_seqs=NUM_REQUESTS, dtype=dtype, devices=(device,))
    if model in OMNI_MODELS:
        from omnistage import Omni

        if "ours" in configs:
            built["omni"] = Omni(path, stage_overrides={"*": engine_config})
        return built
    if {"ours", "request_staggered"} & set(configs):
        built["request"] = DiffusionEngine(path, config=StageDeployConfig(**engine_config))
    if "step_staggered" in configs:
        built["step"] = DiffusionEngine(path, config=StageDeployConfig(**engine_config, step_execution=True))
    return built


def runners(built: dict, kwargs: dict, gap: float) -> dict:
    if "omni" in built:
        return {"ours": lambda: run_omni(built["omni"], kwargs), "sequential": lambda: run_sequential(built["pipe"], kwargs),
                "batched": lambda: run_batched(built["pipe"], kwargs)}
    return {
        "ours": lambda: run_ours(built["request"], kwargs),
        "sequential": lambda: run_sequential(built["pipe"], kwargs),
        "batched": lambda: run_batched(built["pipe"], kwargs),
        "step_staggered": lambda: run_staggered(built["step"], kwargs, gap),
        "request_staggered": lambda: run_staggered(built["request"], kwargs, gap),
    }


def single_latency(engine, kwargs: dict) -> float:
    engine.add_request(stage_requests(kwargs, prefix="warm")[0])
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def bench(model: str, size: str, repeats: int, device: str = "cpu", dtype: str = "float32") -> dict:
    kwargs = call_kwargs(model, size)
    built = build(model, size, CONFIGS, device, dtype)
    # One request's latency alone, warm (the first run pays one-off costs).
    gap = 0.0 if model in OMNI_MODELS else min(single_latency(built["request"], kwargs) for _ in range(3)) / 4
    fns = runners(built, kwargs, gap)
    best = {name: float("inf") for name in fns}
    best_cpu = dict(best)
    results, latency = {}, {"step_staggered": float("inf"), "request_staggered": float("inf")}
    with torch.inference_mode():
        for name, fn in fns.items():  # warm-up
            results[name] = fn()
        for _ in range(repeats):
            for name, fn in fns.items():
                t0, c0 = time.perf_counter(), time.process_time()
                results[name] = fn()
                synchronize(device)  # outputs are PIL images already; this only makes it explicit
                best[name] = min(best[name], time.perf_counter() - t0)
                best_cpu[name] = min(best_cpu[name], time.process_time() - c0)
                if name in latency:
                    latency[name] = min(latency[name], results[name])
    for key in ("request", "step", "omni"):
        if key in built:
            built[key].close()
    diff = max(int(np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max())
               for a, b in zip(results["ours"], results["sequential"]))
    params = sum(p.numel() for c in built["pipe"].components.values() if isinstance(c, torch.nn.Module)
                 for p in c.parameters())
    return {"model": model, "size": size, "device": device, "dtype": dtype, "params_m": params / 1e6, "secs": best, "cpu_secs": best_cpu,
            "gap": gap, "latency": latency,
            "max_pixel_diff": diff}


# -- peak RSS, one process per configuration ----------------------------------------------


def memory_probe(model: str, size: str, config: str, device: str = "cpu", dtype: str = "float32") -> float:
    """Load what `config` needs, run it once; the peak RSS (MiB) seen by a psutil sampler."""
    import psutil

    proc, peak, stop = psutil.Process(), [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    kwargs = call_kwargs(model, size)
    built = build(model, size, (config,), device, dtype)
    with torch.inference_mode():
        runners(built, kwargs, gap=0.0)[config]()
    stop.set()
    sampler.join()
    return max(peak[0], proc.memory_info().rss) / 2**20


def peak_rss(model: str, size: str, threads: int, device: str = "cpu", dtype: str = "float32") -> dict[str, float]:
    out = {}
    for config in CONFIGS[:3] if model in OMNI_MODELS else CONFIGS:
        cmd = [sys.executable, __file__, "--memory-probe", model, size, config, "--threads", str(threads),
               "--device", device, "--dtype", dtype]
        result = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[config] = json.loads(result.stdout.strip().splitlines()[-1])["peak_rss_mib"]
    return out


# -- report ------------------------------------------------------------------------------


def table(rows: list[dict]) -> str:
    device, dtype = (rows[0]["device"], rows[0]["dtype"]) if rows else ("cpu", "float32")
    where = "fp32, CPU" if (device, dtype) == ("cpu", "float32") else f"{dtype}, {device}"
    lines = [
        f"{NUM_REQUESTS} requests (8 prompts, seeds 0-7), the zoo's default call (4 steps, CFG on, 64x64 tiny, "
        f"256x256 small), {where}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), best of the "
        "timed runs, wall clock (process CPU time in brackets). Peak RSS: one process per configuration "
        "(load + one run), psutil.",
        "",
        "| model | params | ours (img/s) | 8x sequential (img/s) | diffusers batched (img/s) "
        "| ours / sequential — goal >= 2.5 on tiny | ours / batched — goal >= 0.9 | max pixel diff vs diffusers "
        "| peak RSS ours / seq / batched |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        s, c, m = r["secs"], r["cpu_secs"], r.get("rss", {})
        rss = " / ".join(f"{m[k]:.0f}" for k in ("ours", "sequential", "batched")) + " MiB" if m else "-"
        lines.append(
            f"| {r['model']} {r['size']} | {r['params_m']:.2f} M | {NUM_REQUESTS / s['ours']:.2f} "
            f"| {NUM_REQUESTS / s['sequential']:.2f} | {NUM_REQUESTS / s['batched']:.2f} "
            f"| {s['sequential'] / s['ours']:.2f}x ({c['sequential'] / c['ours']:.2f}x) "
            f"| {s['batched'] / s['ours']:.2f} ({c['batched'] / c['ours']:.2f}) | {r['max_pixel_diff']} / 255 | {rss} |")
    lines += [
        "",
        "Staggered arrivals: request i arrives at i x gap (gap = a quarter of one request's latency alone); "
        "mean latency from arrival to the final image (best of the timed runs), max_num_seqs=8.",
        "",
        "| model | gap | step mode mean latency | request mode mean latency | step / request "
        "| peak RSS step / request |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["model"] in OMNI_MODELS:
            continue
        lat, m = r["latency"], r.get("rss", {})
        rss = f"{m['step_staggered']:.0f} / {m['request_staggered']:.0f} MiB" if m else "-"
        lines.append(
            f"| {r['model']} {r['size']} | {r['gap'] * 1000:.0f} ms | {lat['step_staggered']:.2f} s "
            f"| {lat['request_staggered']:.2f} s | {lat['step_staggered'] / lat['request_staggered']:.2f} | {rss} |")
    return "\n".join(lines)



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["z-image", "qwen-image"])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: on a shared machine, OpenMP spin-waits dominate a tiny model)")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-configuration peak RSS processes")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--memory-probe", nargs=3, metavar=("MODEL", "SIZE", "CONFIG"), help=argparse.SUPPRESS)
    add_device_args(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_probe:
        print(json.dumps({"peak_rss_mib": memory_probe(*args.memory_probe, args.device, args.dtype)}))
        return
    rows = []
    for model in args.models:
        for size in args.sizes:
            row = bench(model, size, args.repeats, args.device, args.dtype)
            if not args.no_memory:
                row["rss"] = peak_rss(model, size, args.threads, args.device, args.dtype)
            print(json.dumps(row), flush=True)
            rows.append(row)
    body = table(rows)
    print(body)
    if not args.no_write:
        write_section("Diffusion", "benchmarks/bench_diffusion.py", body)


if __name__ == "__main__":
    main()
