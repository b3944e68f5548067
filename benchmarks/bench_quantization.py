"""Quantized DiT against fp32, through `Omni` (the path users take), in one script.

For each `quantization` method, on the zoo's z-image (`--size small`: 256x256, CFG on), one
request through `Omni.generate` at `--steps` and at 2 denoising steps, best of `--repeats`
each by this process's CPU time (the stages run in it; a shared machine's other load does not
count); the DiT step time is their difference over the extra steps, so text encoding and the
VAE decode cancel out. Baseline: the same with no quantization, in the same process. Torch
runs one intra-op thread. Reported per method: step time, speed vs fp32 (> 1 is faster), and
the PSNR of its image against the fp32 image (same seed, same steps).

Goal (issue 38): `int8_dynamic` >= 1.3x at >= 30 dB. Writes "## Dynamic int8 DiT" in
benchmarks/RESULTS.md.

`--ar` measures the native AR engine instead (zoo qwen2-llm `--size`): 4 prompts of 32 tokens,
64 greedy tokens each, one batch through `Omni.generate`, decoded tokens per CPU second, best of
`--repeats`, each method against fp32 (whose CPU Linear layers are oneDNN prepacked ones), and
the share of greedy tokens equal to fp32's. Writes "## Quantized AR stage".

`--layers` times single linear layers at the DiT's and the AR stage's sizes instead (printed, not
written): fp32 `F.linear` (MKL), fp32 oneDNN prepacked (the AR stage's CPU layers), torchao's
`int8_dynamic` weight run eagerly, our `DynamicInt8Linear`, and the `torch._int_mm` product inside
it alone; then the kernels it was chosen over: oneDNN's prepacked `onednn.qlinear_pointwise` alone
on an input already rounded (per-row scales would cost what ours spends around `torch._int_mm`),
and FBGEMM's `quantized.linear_dynamic` whole (one activation scale per call; deprecated quantized
tensors). CPU microseconds per call, median of `--repeats` batches of 200 calls.

    .venv/bin/python benchmarks/bench_quantization.py [--methods int8_dynamic int8] [--repeats 3] [--ar] [--layers]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from common import write_section

ROOT = Path(__file__).resolve().parent.parent
MODEL = "z-image"
PROMPT = "a photo of a cat sitting on a red chair"


def timed_images(omni, kwargs: dict, steps: int, repeats: int) -> tuple[float, np.ndarray]:
    """Best-of-`repeats` CPU seconds of one request at `steps`, and its image in [0, 1]."""
    from omnistage.diffusion.params import DiffusionParams

    fields = {k: v for k, v in kwargs.items() if k in DiffusionParams.model_fields}
    extras = {k: v for k, v in kwargs.items() if k not in DiffusionParams.model_fields}
    params = DiffusionParams(seed=0, extras=extras, **fields, num_inference_steps=steps)
    best, image = float("inf"), None
    for _ in range(repeats):
        start = time.process_time()
        (out,) = omni.generate([PROMPT], [params], use_tqdm=False)
        best = min(best, time.process_time() - start)
        image = np.asarray(out.images[0], dtype=np.float64) / 255
    return best, image


def measure(path: str, kwargs: dict, steps: int, repeats: int, method: str | None, **overrides) -> dict:
    """DiT step time (the difference of `steps` and 2 steps), request time at `steps` and its image,
    with `quantization: method` and any other deploy `overrides`."""
    from omnistage import Omni

    with Omni(path, stage_overrides={"*": {"quantization": method, "dtype": "float32", **overrides}}) as omni:
        timed_images(omni, kwargs, 2, 1)  # warm-up: first-call allocations and lazy imports
        short, _ = timed_images(omni, kwargs, 2, repeats)
        long, image = timed_images(omni, kwargs, steps, repeats)
    return {"step_s": (long - short) / (steps - 2), "request_s": long, "image": image}


AR_PROMPTS, AR_PROMPT_LEN, AR_NEW = 4, 32, 64


def measure_ar(path: str, repeats: int, method: str | None) -> dict:
    from omnistage import Omni
    from omnistage.ar.sampling_params import SamplingParams

    prompts = [{"prompt_token_ids": [(7 * i + 13 * j) % 500 + 10 for j in range(AR_PROMPT_LEN)]}
               for i in range(AR_PROMPTS)]
    params = SamplingParams(temperature=0.0, max_tokens=AR_NEW, min_tokens=AR_NEW)
    with Omni(path, devices=("cpu",), dtype="float32", max_num_seqs=AR_PROMPTS, quantization=method) as omni:
        omni.generate(prompts, params, use_tqdm=False)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            start = time.process_time()
            outs = omni.generate(prompts, params, use_tqdm=False)
            best = min(best, time.process_time() - start)
    return {"tok_s": AR_PROMPTS * AR_NEW / best, "tokens": [o.token_ids for o in outs]}


def bench_ar(args) -> None:
    from omnistage.testing import ensure

    path = str(ensure("qwen2-llm", size=args.size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    start_load = os.getloadavg()[0]
    plain = measure_ar(path, args.repeats, None)
    rows = []
    for method in args.methods:
        got = measure_ar(path, args.repeats, method)
        same = sum(a == b for x, y in zip(got["tokens"], plain["tokens"]) for a, b in zip(x, y))
        rows.append((method, got["tok_s"], got["tok_s"] / plain["tok_s"], same / (AR_PROMPTS * AR_NEW)))
    load = os.getloadavg()
    lines = [f"qwen2-llm {args.size}, {AR_PROMPTS} prompts of {AR_PROMPT_LEN} tokens, {AR_NEW} greedy tokens each, one "
             f"batch through `Omni.generate`, one torch thread, tokens per CPU second of the process (whole "
             f"requests, prefill included), best of {args.repeats}; tokens equal to fp32's: the share of positions "
             "(random weights: near-ties flip and the rest of a sequence follows). 1-min load average at the start: "
             f"{start_load:.2f}, at the end: {load[0]:.2f} ({os.cpu_count()} cores, shared).", "",
             "| quantization | tokens/s | speed vs fp32 | tokens equal to fp32's |", "|---|---|---|---|",
             f"| none (fp32, oneDNN prepacked) | {plain['tok_s']:.0f} | 1.00x | - |"]
    lines += [f"| `{m}` | {t:.0f} | {r:.2f}x | {same:.0%} |" for m, t, r, same in rows]
    lines += versus_int8({m: r for m, _, r, _ in rows}, "tokens/s")
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section("Quantized AR stage", "benchmarks/bench_quantization.py", body)


def versus_int8(speeds: dict[str, float], unit: str) -> list[str]:
    """A line comparing `int8_dynamic` with weight-only `int8`, when both ran."""
    if not {"int8_dynamic", "int8"} <= speeds.keys():
        return []
    return ["", f"`int8_dynamic` against weight-only `int8` in the same run: "
                f"{speeds['int8_dynamic'] / speeds['int8']:.2f}x the {unit}."]


LAYER_SIZES = [(576, 128, 128), (576, 128, 341), (576, 341, 128), (4, 512, 512), (4, 768, 512), (128, 512, 768)]
"""(rows, in, out): z-image small's transformer layers (two CFG rows of 288 tokens) and qwen2-llm small's
at a 4-sequence decode step and a 4 x 32-token prefill."""


def per_call_us(fn, repeats: int, calls: int = 200) -> float:
    """Median over `repeats` batches of the CPU microseconds per call."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            fn()
        times.append((time.process_time() - start) / calls * 1e6)
    return float(np.median(times))


def bench_layers(args) -> None:
    import copy

    import torch
    import torchao.quantization

    from omnistage.core.cpu_linear import PrepackedLinear
    from omnistage.core.int8_linear import DynamicInt8Linear

    load = os.getloadavg()[0]
    lines = ["| rows x in -> out | fp32 | fp32 prepacked | torchao `int8_dynamic` | ours | its `torch._int_mm` "
             "| `qlinear_pointwise` alone | FBGEMM `linear_dynamic` |", "|---|---|---|---|---|---|---|---|"]
    torch.manual_seed(0)
    for rows, n_in, n_out in LAYER_SIZES:
        linear, x = torch.nn.Linear(n_in, n_out), torch.randn(rows, n_in)
        theirs = copy.deepcopy(linear)
        torchao.quantization.quantize_(theirs, torchao.quantization.Int8DynamicActivationInt8WeightConfig(
            set_inductor_config=False))
        packed, ours = PrepackedLinear(linear), DynamicInt8Linear(linear)
        qx = torch.randint(-128, 128, (rows, n_in), dtype=torch.int8)
        onednn_weight = torch.ops.onednn.qlinear_prepack(ours.qweight, None)
        zero_points = torch.zeros(n_out, dtype=torch.long)
        fbgemm_weight = torch.ops.quantized.linear_prepack(torch.quantize_per_channel(
            linear.weight.detach(), ours.weight_scale.double(), zero_points, 0, torch.qint8), linear.bias.detach())
        kernels = (lambda: linear(x), lambda: packed(x), lambda: theirs(x), lambda: ours(x),
                   lambda: torch._int_mm(qx, ours.qweight.t()),
                   lambda: torch.ops.onednn.qlinear_pointwise(qx.view(torch.uint8), 1.0, 128, onednn_weight,
                                                              ours.weight_scale, zero_points, None, 1.0, 0,
                                                              torch.float32, "none", [], ""),
                   lambda: torch.ops.quantized.linear_dynamic(x, fbgemm_weight, False))
        with torch.inference_mode():
            times = [per_call_us(f, args.repeats) for f in kernels]
        lines.append(f"| {rows} x {n_in} -> {n_out} | " + " | ".join(f"{t:.0f}" for t in times) + " |")
    print(f"CPU us per call, median of {args.repeats} x 200 calls, one torch thread; 1-min load average at the start: "
          f"{load:.2f}, at the end: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores, shared).\n")
    print("\n".join(lines))


def psnr(got: np.ndarray, want: np.ndarray) -> float:
    mse = float(np.mean((got - want) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["int8_dynamic", "int8"])
    parser.add_argument("--size", default="small", choices=("tiny", "small"))
    parser.add_argument("--steps", type=int, default=6, help="denoising steps of the long run (> 2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ar", action="store_true", help="the native AR engine on qwen2-llm instead of the DiT")
    parser.add_argument("--layers", action="store_true", help="single linear layers, printed (see above)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    import torch

    from omnistage.testing import call_kwargs, ensure

    torch.set_num_threads(1)
    if args.layers:
        return bench_layers(args)
    if args.ar:
        return bench_ar(args)
    path = str(ensure(MODEL, size=args.size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    kwargs = {k: v for k, v in call_kwargs(MODEL, args.size).items() if k not in ("prompt", "num_inference_steps")}
    start_load = os.getloadavg()[0]
    plain = measure(path, kwargs, args.steps, args.repeats, None)
    rows = []
    for method in args.methods:
        got = measure(path, kwargs, args.steps, args.repeats, method)
        rows.append((method, got["step_s"], plain["step_s"] / got["step_s"], psnr(got["image"], plain["image"])))
    load = os.getloadavg()

    lines = [f"z-image {args.size} ({kwargs['height']}x{kwargs['width']}, CFG on), one request through `Omni.generate`, "
             f"one torch thread, fp32 weights; DiT step time = (CPU time at {args.steps} steps - CPU time at 2 steps) / "
             f"{args.steps - 2}, best of {args.repeats} each; PSNR of the {args.steps}-step image against fp32's "
             f"(seed 0). 1-min load average at the start: {start_load:.2f}, at the end: {load[0]:.2f} "
             f"({os.cpu_count()} cores, shared).",
             "", "| quantization | DiT step time | speed vs fp32 | PSNR vs fp32 |", "|---|---|---|---|",
             f"| none (fp32) | {plain['step_s'] * 1e3:.1f} ms | 1.00x | - |"]
    lines += [f"| `{m}` | {s * 1e3:.1f} ms | {r:.2f}x | {p:.1f} dB |" for m, s, r, p in rows]
    lines += versus_int8({m: r for m, _, r, _ in rows}, "steps per second")
    for method, _, ratio, quality in rows:
        if method == "int8_dynamic":
            met = ratio >= 1.3 and quality >= 30
            lines += ["", f"Goal `int8_dynamic` >= 1.3x at >= 30 dB: {'met' if met else 'missed'} "
                          f"({ratio:.2f}x at {quality:.1f} dB)."]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section("Dynamic int8 DiT", "benchmarks/bench_quantization.py", body)


if __name__ == "__main__":
    main()
