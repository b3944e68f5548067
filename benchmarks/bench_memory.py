"""Memory and kernel options of a diffusion stage against the plain stage, in one script.

For each option (a deploy field set on an otherwise plain stage) on the zoo's z-image and
qwen-image: 4 requests (seeds 0-3) through `DiffusionEngine` (request mode, max_num_seqs=4,
the zoo's default call: 4 steps, CFG on) and the same 4 through the plain engine, best of
`--repeats`. Each engine is alone on the device while it is built and measured (the one
before it is closed and its memory freed), so an option's peak is its own. Reported per option:

- speed: plain time / option time (> 1 is faster);
- memory: transformer weight bytes (quantization), peak device memory (offload, CUDA only:
  on a CPU the execution and offload devices are one, so offload saves nothing there);
- quality: PSNR of the option's images against the plain run's (same seeds; inf = identical);
  LoRA rows compare against diffusers' `load_lora_weights` with the same seed instead, since
  an adapter is meant to change the image.

`--compile` adds the regional torch.compile rows (inductor; several minutes of compile on a
small CPU): compile time, steady-state ratio, and the graphs compiled over batch sizes 1-4.
Writes "## Memory and kernel options" in benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/bench_memory.py [--models z-image qwen-image] [--size small] [--compile]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from common import add_device_args, synchronize, write_section

ROOT = Path(__file__).resolve().parent.parent
NUM_REQUESTS = 4
OPTIONS = {
    "quantization: int8": dict(quantization="int8"),
    "quantization: fp8": dict(quantization="fp8"),
    "quantization: int8_dynamic": dict(quantization="int8_dynamic"),
    "quantization: fp8_dynamic": dict(quantization="fp8_dynamic"),
    "offload: model": dict(offload="model"),
    "offload: layerwise": dict(offload="layerwise"),
    "attention_backend: sdpa_math": dict(attention_backend="sdpa_math"),
    "lora (static, fused)": "lora_static",
    "lora_adapters (per request)": "lora_request",
}
CUDA_ONLY = ("quantization: int8_dynamic", "quantization: fp8_dynamic")
"""Left out of the default options on a CPU: fp8_dynamic is refused there; int8_dynamic is left out
of this table (bench_quantization.py measures its CPU layers through Omni)."""


def call_kwargs(model: str, size: str) -> dict:
    from omnistage.testing import call_kwargs as zoo_call_kwargs

    kwargs = zoo_call_kwargs(model, size)
    kwargs.pop("prompt")
    return kwargs


def stage_requests(kwargs: dict, lora: dict | None = None, prefix: str = "r") -> list:
    from omnistage.core.types import StageRequest
    from omnistage.diffusion.params import DiffusionParams

    fields = {k: v for k, v in kwargs.items() if k in DiffusionParams.model_fields}
    extras = {k: v for k, v in kwargs.items() if k not in DiffusionParams.model_fields}
    return [StageRequest(f"{prefix}{i}", "a photo of a cat sitting on a red chair",
                         DiffusionParams(seed=i, extras=extras, lora=lora, **fields)) for i in range(NUM_REQUESTS)]


def run(engine, kwargs: dict, lora: dict | None = None) -> list[np.ndarray]:
    for request in stage_requests(kwargs, lora):
        engine.add_request(request)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                assert out.error is None, out.error
                done[out.request_id] = np.asarray(out.payload.images[0], dtype=np.float64) / 255
    return [done[f"r{i}"] for i in range(NUM_REQUESTS)]


def psnr(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    mse = float(np.mean([np.mean((g - w) ** 2) for g, w in zip(got, want)]))
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def pipeline_of(engine):
    return engine.executor.worker.runner.pipeline


def engine_for(path: str, device: str, dtype: str, **fields):
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.engine import DiffusionEngine

    config = StageDeployConfig(max_num_seqs=NUM_REQUESTS, dtype=dtype, devices=(device,), **fields)
    return DiffusionEngine(path, config=config)


def timed(fn, device: str) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - t0, result


def free(engine, device: str) -> None:
    """Close an engine and give its device memory back, so the next one is measured alone."""
    engine.close()
    del engine
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def measure(path: str, kwargs: dict, repeats: int, device: str, dtype: str, fields: dict,
            lora: dict | None = None) -> dict:
    """One engine alone on the device: built, warmed up, timed (best of `repeats`), closed.
    Its peak device memory counts from what was allocated before it was built, so weights
    (or their absence, offloaded) and activations are its own, with no other engine's."""
    from omnistage.core.quantization import weight_bytes

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    engine = engine_for(path, device, dtype, **fields)
    run(engine, kwargs, lora)  # warm-up
    best, images = float("inf"), None
    for _ in range(repeats):
        t, images = timed(lambda: run(engine, kwargs, lora), device)
        best = min(best, t)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if device.startswith("cuda") else None
    result = {"seconds": best, "images": images, "bytes": weight_bytes(pipeline_of(engine).transformer),
              "peak": peak}
    free(engine, device)
    return result


def diffusers_lora_reference(path: str, kwargs: dict, lora_file: str, scale: float, device: str, dtype: str):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, dtype=getattr(torch, dtype)).to(device)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(lora_file, adapter_name="style")
    pipe.set_adapters(["style"], adapter_weights=[scale])
    return [np.asarray(pipe(prompt="a photo of a cat sitting on a red chair", **kwargs,
                            generator=torch.Generator("cpu").manual_seed(i)).images[0], dtype=np.float64) / 255
            for i in range(NUM_REQUESTS)]


def bench(model: str, size: str, repeats: int, device: str, dtype: str, options: list[str]) -> list[dict]:
    from omnistage.testing import ensure
    from omnistage.testing.lora import build_lora

    path = str(ensure(model, size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    lora_file = str(build_lora(path, Path(tempfile.mkdtemp()) / "style.safetensors", seed=1))
    kwargs = call_kwargs(model, size)
    rows = []
    with torch.inference_mode():
        plain = measure(path, kwargs, repeats, device, dtype, {})
        for label in options:
            fields, lora = OPTIONS[label], None
            if fields == "lora_static":
                fields = dict(lora=[{"path": lora_file, "scale": 0.8}])
            elif fields == "lora_request":
                fields, lora = dict(lora_adapters={"style": lora_file}), {"name": "style", "scale": 0.8}
            option = measure(path, kwargs, repeats, device, dtype, fields, lora)
            if label.startswith("lora"):
                want = diffusers_lora_reference(path, kwargs, lora_file, 0.8, device, dtype)
                against = "diffusers load_lora_weights"
            else:
                want, against = plain["images"], "plain run"
            rows.append({
                "model": f"{model} {size}", "option": label, "speed": plain["seconds"] / option["seconds"],
                "option_s": option["seconds"], "plain_s": plain["seconds"], "bytes": option["bytes"] / plain["bytes"],
                "peak": None if option["peak"] is None else (option["peak"], plain["peak"]),
                "psnr": psnr(option["images"], want), "against": against,
            })
            print(rows[-1], flush=True)
    return rows


def bench_compile(model: str, size: str, device: str, dtype: str, repeats: int) -> dict:
    from torch._dynamo.utils import counters

    from omnistage.testing import ensure

    path = str(ensure(model, size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    kwargs = call_kwargs(model, size)
    plain, compiled = engine_for(path, device, dtype), engine_for(path, device, dtype, compile=True)
    torch._dynamo.reset()
    counters.clear()
    with torch.inference_mode():
        run(plain, kwargs)
        compile_s, want = timed(lambda: run(compiled, kwargs), device)  # the first run compiles
        graphs_first = counters["stats"]["unique_graphs"]
        for n in (1, 2, 3):  # other batch sizes, as step mode makes them
            for request in stage_requests(kwargs)[:n]:
                compiled.add_request(request)
            while compiled.has_unfinished_requests():
                compiled.step()
        graphs_sizes = counters["stats"]["unique_graphs"]
        best_plain = best_compiled = float("inf")
        for _ in range(repeats):
            t, want = timed(lambda: run(plain, kwargs), device)
            best_plain = min(best_plain, t)
            t, got = timed(lambda: run(compiled, kwargs), device)
            best_compiled = min(best_compiled, t)
    plain.close()
    compiled.close()
    return {"model": f"{model} {size}", "compile_s": compile_s, "speed": best_plain / best_compiled,
            "graphs_first": graphs_first, "graphs_sizes": graphs_sizes,
            "graphs_end": counters["stats"]["unique_graphs"], "psnr": psnr(got, want)}


def fmt_db(value: float) -> str:
    return "inf (identical)" if value == float("inf") else f"{value:.1f} dB"


def table(rows: list[dict], compile_rows: list[dict], device: str, dtype: str) -> str:
    lines = [
        f"{NUM_REQUESTS} requests (seeds 0-{NUM_REQUESTS - 1}), the zoo's default call (4 steps, CFG on), request mode "
        f"max_num_seqs={NUM_REQUESTS}, {dtype} on {device}, {torch.get_num_threads()} torch thread(s), best of the "
        "timed runs, each engine alone on the device (peak memory above what was allocated before it was "
        "built). Measured on a shared, loaded machine: speed ratios are noisy (about +-10%).",
        "",
        "| model | option | speed vs plain | transformer weight bytes vs plain | peak device memory option / plain "
        "| PSNR | against |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        peak = "n/a on CPU" if r["peak"] is None else f"{r['peak'][0]:.0f} / {r['peak'][1]:.0f} MiB"
        lines.append(f"| {r['model']} | `{r['option']}` | {r['speed']:.2f}x | {r['bytes']:.2f}x | {peak} | "
                     f"{fmt_db(r['psnr'])} | {r['against']} |")
    if compile_rows:
        lines += ["", "Regional `torch.compile` (inductor) of the repeated transformer blocks: the first run "
                  "includes compiling; graphs are dynamo's unique graphs after the first run, after batch sizes "
                  "1-3 and at the end.", "",
                  "| model | compile time (first run) | steady state vs eager — goal >= 1.15x | graphs first / after "
                  "sizes / end | PSNR vs eager |", "| --- | --- | --- | --- | --- |"]
        for r in compile_rows:
            lines.append(f"| {r['model']} | {r['compile_s']:.0f} s | {r['speed']:.2f}x | {r['graphs_first']} / "
                         f"{r['graphs_sizes']} / {r['graphs_end']} | {fmt_db(r['psnr'])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["z-image", "qwen-image"])
    parser.add_argument("--size", default="small", choices=["tiny", "small"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--options", nargs="+", choices=list(OPTIONS),
                        help="which options to measure (default: all; on a CPU all but the dynamic quantization)")
    parser.add_argument("--compile", action="store_true", help="also the torch.compile rows (slow on CPU)")
    parser.add_argument("--compile-models", nargs="+", default=["z-image"])
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    add_device_args(parser)
    args = parser.parse_args()
    if args.options is None:
        args.options = [o for o in OPTIONS if args.device.startswith("cuda") or o not in CUDA_ONLY]
    torch.set_num_threads(1)
    rows = [r for m in args.models for r in bench(m, args.size, args.repeats, args.device, args.dtype, args.options)]
    compile_rows = ([bench_compile(m, args.size, args.device, args.dtype, args.repeats) for m in args.compile_models]
                    if args.compile else [])
    body = table(rows, compile_rows, args.device, args.dtype)
    print(body)
    if not args.no_write:
        write_section("Memory and kernel options", "benchmarks/bench_memory.py", body)


if __name__ == "__main__":
    main()
