"""Step caches: wall speed-up and quality against no cache, and against cache-dit on diffusers.

One request per run (seed 0), the zoo's small Qwen-Image and Z-Image (256x256) and Wan
(128x128, 5 frames), 50 steps, CFG on, fp32, one torch thread, unless `--device` /
`--dtype` / `--steps` say otherwise. For each model, in one process:

- ours, no cache: the native pipeline loaded through the stage's load path
  (`from_pretrained` with the deploy config), `denoise` + `decode_arrays`; the baseline;
- ours with `cache_backend` first_block_cache / tea_cache / easycache / mag_cache / cache_dit at
  each threshold of `--grid` (first_block_cache, easycache, mag_cache and cache_dit: `warmup_steps` /
  `max_warmup_steps` = `--warmup`, cache_dit F1B0);
- diffusers, no cache, and cache-dit's DBCache (F1B0, the same grid and warm-up) applied to
  the diffusers pipeline itself with `cache_dit.enable_cache(pipe, ...)`.

Each row: transformer forwards computed of the total (one per CFG branch per step), wall
speed-up against its own uncached baseline (ours vs ours, diffusers + cache-dit vs
diffusers), the ideal speed-up total / computed, their ratio (the cache's own overhead:
goal >= 0.9), and PSNR of the output against its uncached baseline (same seed). Every
timed run is preceded by a 2-step warm-up; the best of `--repeats` counts; each baseline is
timed again between the groups of cached runs, and its best time counts (the machine is shared). Writes
"## Step caches" (or `--section`) in benchmarks/RESULTS.md unless `--no-write`.

`--targets N ...` compares the caches at equal work: the table keeps, per model, backend and
target, the grid's row whose computed forwards are nearest N (thresholds mean different
things to each cache, so the grid must span them all).

    .venv/bin/python benchmarks/bench_cache.py [--models qwen-image z-image wan-t2v] [--steps 50]
    .venv/bin/python benchmarks/bench_cache.py --models qwen-image --backends easycache tea_cache \
        first_block_cache --no-diffusers --targets 50 30 20 --section "Step caches: EasyCache"
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial

import numpy as np
import torch

from common import add_device_args, synchronize, torch_dtype, write_section

MODELS = {"qwen-image": "QwenImagePipeline", "z-image": "ZImagePipeline", "wan-t2v": "WanPipeline"}
THRESHOLD = {"first_block_cache": "threshold", "tea_cache": "rel_l1_thresh", "easycache": "threshold",
             "mag_cache": "threshold", "cache_dit": "residual_diff_threshold"}
WARMUP = {"first_block_cache": "warmup_steps", "easycache": "warmup_steps", "mag_cache": "warmup_steps",
          "cache_dit": "max_warmup_steps"}
BATCHED_BRANCHES = {"z-image"}  # cond and uncond in one transformer call


def call_kwargs(model: str, steps: int) -> dict:
    from omnistage.testing import call_kwargs as zoo_call_kwargs

    kwargs = dict(zoo_call_kwargs(model, "small"), num_inference_steps=steps)
    if model == "wan-t2v":
        kwargs.update(num_frames=5, guidance_scale=4.0)
    return kwargs


def request(kwargs: dict):
    from omnistage.diffusion.params import DiffusionParams
    from omnistage.diffusion.pipeline import DiffusionRequest

    kwargs = dict(kwargs)
    prompt = kwargs.pop("prompt")
    fields = {k: kwargs.pop(k) for k in list(kwargs) if k in DiffusionParams.model_fields}
    return DiffusionRequest("r0", prompt, DiffusionParams(seed=0, extras=kwargs, **fields))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def timed(fn, repeats: int, device: str):
    """((best wall seconds, best process CPU seconds), the last output). On a shared machine the
    CPU time of a one-thread run is the steadier of the two."""
    best, best_cpu, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        synchronize(device)
        start, cpu = time.perf_counter(), time.process_time()
        out = fn()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return (best, best_cpu), out


# -- ours --------------------------------------------------------------------------------


def load_ours(path, model: str, kwargs: dict, args, backend: str | None = None, threshold: float | None = None):
    """A timed-run function for our pipeline: () -> (seconds, float output, computed, total)."""
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.registry import pipeline_class

    config = {}
    if backend is not None:
        config[THRESHOLD[backend]] = threshold
        if backend in WARMUP:
            config[WARMUP[backend]] = args.warmup
    deploy = StageDeployConfig(cache_backend=backend, cache_config=config)
    pipeline = pipeline_class(MODELS[model]).from_pretrained(str(path), args.device, torch_dtype(args.dtype),
                                                             deploy=deploy)
    pipeline.decode_arrays(pipeline.denoise([request(dict(kwargs, num_inference_steps=2))]))  # warm-up
    holder = {}

    def once():
        (state,) = pipeline.denoise([request(kwargs)])
        holder["metrics"] = pipeline.state_metrics(state)
        return pipeline.decode_arrays([state])[0]

    def run():
        seconds, arr = timed(once, args.repeats, args.device)
        m = holder["metrics"]
        return seconds, arr, m["num_forwards_computed"], m["num_forwards_computed"] + m["num_forwards_skipped"]

    return run


# -- diffusers, and cache-dit on diffusers ------------------------------------------------


def load_diffusers(path, model: str, kwargs: dict, args, threshold: float | None = None):
    """A timed-run function for the diffusers pipeline, with cache-dit's DBCache when `threshold`."""
    import cache_dit
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(path), dtype=torch_dtype(args.dtype)).to(args.device)
    pipe.set_progress_bar_config(disable=True)
    guided = 2  # every model here runs CFG (a negative prompt and a scale above 1)
    if threshold is not None:
        cache_dit.enable_cache(pipe, cache_config=cache_dit.DBCacheConfig(
            Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=threshold,
            max_warmup_steps=args.warmup))

    def call(steps: int) -> np.ndarray:
        out = pipe(**dict(kwargs, num_inference_steps=steps), generator=torch.Generator("cpu").manual_seed(0),
                   output_type="np")
        return np.asarray(out.frames[0] if hasattr(out, "frames") else out.images)

    call(2)  # warm-up

    def run():
        seconds, arr = timed(lambda: call(kwargs["num_inference_steps"]), args.repeats, args.device)
        total = guided * kwargs["num_inference_steps"]
        skipped = 0
        if threshold is not None:
            stats = cache_dit.summary(pipe.transformer, logging=False)[0]
            cached, cfg_cached = len(stats.cached_steps or []), len(stats.cfg_cached_steps or [])
            skipped = cached * guided if model in BATCHED_BRANCHES else cached + cfg_cached
        return seconds, arr, total - skipped, total

    return run


# -- the table ----------------------------------------------------------------------------


def row(model: str, label: str, threshold: float, seconds: tuple, arr, computed: int, total: int,
        base_seconds: tuple, base_arr) -> dict:
    speedup = base_seconds[0] / seconds[0]
    ideal = total / computed
    return {"model": model, "run": label, "threshold": threshold, "computed": computed, "total": total,
            "speedup": speedup, "ideal": ideal, "efficiency": speedup / ideal, "psnr": psnr(arr, base_arr),
            "cpu_speedup": base_seconds[1] / seconds[1], "seconds": seconds[0]}


def nearest(rows: list[dict], targets: list[int]) -> list[dict]:
    """Per model, target and run, the row whose computed forwards are nearest the target (on a
    tie, the one that computes more)."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for target in targets:
            for run in dict.fromkeys(r["run"] for r in rows if r["model"] == model):
                candidates = [r for r in rows if r["model"] == model and r["run"] == run]
                out.append(min(candidates, key=lambda r: (abs(r["computed"] - target), -r["computed"])))
    return out


def table(rows: list[dict]) -> str:
    lines = ["| model | run | threshold | forwards computed | wall speed-up | ideal (total / computed) | "
             "speed-up / ideal — goal >= 0.9 | PSNR vs no cache (dB) | seconds | CPU-time speed-up |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['run']} | {r['threshold']} | {r['computed']}/{r['total']} | "
                     f"{r['speedup']:.2f}x | {r['ideal']:.2f}x | {r['efficiency']:.2f} | {r['psnr']:.1f} | "
                     f"{r['seconds']:.2f} | {r['cpu_speedup']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--backends", nargs="+", default=list(THRESHOLD), choices=list(THRESHOLD))
    parser.add_argument("--grid", nargs="+", type=float, default=[0.05, 0.1, 0.2, 0.4, 0.8, 1.5])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=8, help="always-computed first steps (FBC, EasyCache, MagCache, cache-dit)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--size", default="small", choices=["tiny", "small"])
    parser.add_argument("--no-diffusers", action="store_true", help="skip cache-dit on the diffusers pipeline")
    parser.add_argument("--targets", nargs="+", type=int, help="keep, per backend, the rows nearest these "
                        "computed forwards")
    parser.add_argument("--section", default="Step caches", help="the RESULTS.md heading to write")
    parser.add_argument("--no-write", action="store_true")
    add_device_args(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from omnistage.testing import ensure

    load_before = os.getloadavg()[0]
    rows = []
    for model in args.models:
        path = ensure(model, size=args.size)
        kwargs = call_kwargs(model, args.steps)
        # The machine is shared: each baseline is timed again after every group of cached runs,
        # and its best time is the one every speed-up of the model is measured against.
        sides = [("ours", load_ours(path, model, kwargs, args),
                  [(f"ours {b}", t, partial(load_ours, path, model, kwargs, args, b, t))
                   for b in args.backends for t in args.grid])]
        if not args.no_diffusers:
            sides.append(("diffusers", load_diffusers(path, model, kwargs, args),
                          [("diffusers + cache-dit DBCache", t, partial(load_diffusers, path, model, kwargs, args, t))
                           for t in args.grid]))
        for _, baseline, runs in sides:
            base_times, base_arr, measured = [], None, []
            for i, (label, threshold, load) in enumerate(runs):
                if i % len(args.grid) == 0:
                    seconds, base_arr, _, _ = baseline()
                    base_times.append(seconds)
                measured.append((label, threshold, *load()()))
                print(label, threshold, measured[-1][2:3], measured[-1][4:], flush=True)
            seconds, _, _, _ = baseline()
            base_times.append(seconds)
            best_base = (min(t[0] for t in base_times), min(t[1] for t in base_times))
            for label, threshold, seconds, arr, computed, total in measured:
                rows.append(row(model, label, threshold, seconds, arr, computed, total, best_base, base_arr))
            print(table(rows), flush=True)
    if args.targets:
        rows = nearest(rows, args.targets)
    body = (f"One request, {args.steps} steps, CFG on, zoo {args.size} models (256x256 images; Wan 128x128, "
            f"5 frames), {args.dtype} on {args.device}, {args.threads} torch thread(s), best of {args.repeats}; "
            f"first_block_cache, easycache, mag_cache and cache-dit F1B0 with {args.warmup} warm-up steps. Speed-ups are against "
            "the same side's uncached run in the same process (ours vs ours; diffusers + cache-dit vs "
            "diffusers). Random-weight models, not real checkpoints: the curves show the mechanics, not "
            f"the quality a real checkpoint keeps. Load average (1 min) {load_before:.1f} at the start, "
            f"{os.getloadavg()[0]:.1f} at the end.\n\n" + table(rows))
    print(body)
    if not args.no_write:
        write_section(args.section, "benchmarks/bench_cache.py", body)


if __name__ == "__main__":
    main()
