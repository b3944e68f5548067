"""The diffusion transformer's linears prepacked through oneDNN on CPU (`prepack_linears: true`)
against torch's matmul (`prepack_linears: false`), through `Omni`, in one script.

For each model (`--models`, zoo `--size` small: 256x256), one request through `Omni.generate` at
`--steps` and at 2 denoising steps, best of `--repeats` each by this process's CPU time
(bench_quantization.measure: the DiT step time is their difference over the extra steps, so text
encoding and the VAE decode cancel out); the baseline is the same stage unpacked, in the same
process. One torch thread. Reported per model: DiT step time both ways, speed (> 1: packed is
faster), the request's CPU time at `--steps` both ways, and the largest difference between the two
images in 8-bit levels.

`--rows` times only the packed layout's row hint (printed; the full run writes it too): the (rows, in, out)
of every call to a block linear in one request's steps, recorded by forward hooks, each timed
as torch's matmul and packed for 8, 256 and 1024 rows; CPU milliseconds per request (the sum
over the calls), best of `--repeats`.

Goal: >= 1.3x on the DiT step. Writes "## Diffusion: prepacked linears on CPU" in
benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/bench_prepack.py [--models z-image flux] [--repeats 3] [--rows]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bench_quantization import measure
from common import write_section

ROOT = Path(__file__).resolve().parent.parent
ROW_HINTS = (8, 256, 1024)


def block_linear_calls(path: str, kwargs: dict) -> Counter:
    """(rows, in, out) -> how many calls one request makes to the transformer blocks' linears."""
    import torch

    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.accel.prepack import transformer_blocks
    from omnistage.diffusion.params import DiffusionParams
    from omnistage.diffusion.registry import pipeline_class
    from omnistage.diffusion.request import DiffusionRequest

    key = json.loads((Path(path) / "model_index.json").read_text())["_class_name"]
    pipeline = pipeline_class(key).from_pretrained(path, deploy=StageDeployConfig(prepack_linears=False))
    calls = Counter()
    linears = {id(m): m for block in transformer_blocks(pipeline) for m in block.modules()
               if type(m) is torch.nn.Linear}
    for module in linears.values():  # the layers `prepack_linears` packs, each once (a block list holds blocks)
        module.register_forward_hook(lambda m, args, _out: calls.update(
            [(args[0].numel() // m.in_features, m.in_features, m.out_features)]))
    fields = {k: v for k, v in kwargs.items() if k in DiffusionParams.model_fields}
    extras = {k: v for k, v in kwargs.items() if k not in DiffusionParams.model_fields and k != "prompt"}
    request = DiffusionRequest(request_id="r", prompt=kwargs["prompt"],
                               params=DiffusionParams(seed=0, extras=extras, **fields))
    pipeline.denoise([request])
    return calls


def best_cpu_ms(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best * 1e3


def bench_rows(args, paths: dict[str, str], kwargs: dict[str, dict]) -> tuple[list[str], dict[str, tuple]]:
    """The row-hint table's lines (see the module docstring), and per model the block linears' CPU
    ms per denoising step: (torch matmul, packed for PACKED_FOR_ROWS)."""
    from omnistage.core.cpu_linear import PACKED_FOR_ROWS

    import torch

    lines = [f"Row hint of the packed layout: the block linear calls of one request of each model (recorded by forward "
             f"hooks, as rows x in -> out (calls)), each timed with torch's matmul and packed "
             f"for {', '.join(map(str, ROW_HINTS))} rows; CPU ms per request, best of {args.repeats}.", "",
             "| model | calls | torch matmul | " + " | ".join(f"packed for {h}" for h in ROW_HINTS) + " | 1-min load |",
             "|---|---|---|" + "---|" * len(ROW_HINTS) + "---|"]
    per_step = {}
    for model, path in paths.items():
        calls = block_linear_calls(path, kwargs[model])
        layers = []
        for (rows, n_in, n_out), count in calls.items():
            linear = torch.nn.Linear(n_in, n_out)
            x = torch.randn(rows, n_in)
            packed = {h: torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), h) for h in ROW_HINTS}
            layers.append((linear, x, packed, count))

        def matmul():
            with torch.no_grad():
                for linear, x, _, count in layers:
                    for _ in range(count):
                        linear(x)

        def packed_for(hint):
            def run():
                for linear, x, packed, count in layers:
                    for _ in range(count):
                        torch.ops.mkldnn._linear_pointwise(x, packed[hint], linear.bias.detach(), "none", [], "")
            return run

        shapes = ", ".join(f"{r}x{i}->{o} ({c})" for (r, i, o), c in sorted(calls.items()))
        times = [best_cpu_ms(matmul, args.repeats)] + [best_cpu_ms(packed_for(h), args.repeats) for h in ROW_HINTS]
        lines.append(f"| {model} | {shapes} | " + " | ".join(f"{t:.1f}" for t in times)
                     + f" | {os.getloadavg()[0]:.2f} |")
        steps = kwargs[model]["num_inference_steps"]
        per_step[model] = (times[0] / steps, times[1 + ROW_HINTS.index(PACKED_FOR_ROWS)] / steps)
    return lines, per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["z-image", "flux"])
    parser.add_argument("--size", default="small", choices=("tiny", "small"))
    parser.add_argument("--steps", type=int, default=6, help="denoising steps of the long run (> 2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", action="store_true", help="the packed layout's row hint, printed (see above)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    import torch

    from omnistage.testing import call_kwargs, ensure

    torch.set_num_threads(1)
    paths = {m: str(ensure(m, size=args.size, cache_dir=ROOT / ".omnistage-cache" / "zoo")) for m in args.models}
    kwargs = {m: call_kwargs(m, args.size) for m in args.models}
    if args.rows:
        return print("\n".join(bench_rows(args, paths, kwargs)[0]))
    lines = [f"Zoo `{args.size}` models through `Omni.generate`, one request (256x256, the zoo's guidance), one "
             f"torch thread, fp32; DiT step time = (CPU time at {args.steps} steps - CPU time at 2 steps) / "
             f"{args.steps - 2}, best of {args.repeats} each, packed (`prepack_linears: true`) and "
             f"unpacked (`prepack_linears: false`) in the same process; request = CPU time of the "
             f"{args.steps}-step request; image diff = largest difference of the two images in 8-bit levels.",
             "", "| model | DiT step unpacked | packed | speed | request unpacked | packed | speed | image diff "
                 "| 1-min load |", "|---|---|---|---|---|---|---|---|---|"]
    ratios, steps_ms = {}, {}
    for model in args.models:
        call = {k: v for k, v in kwargs[model].items() if k not in ("prompt", "num_inference_steps")}
        plain = measure(paths[model], call, args.steps, args.repeats, None, prepack_linears=False)
        packed = measure(paths[model], call, args.steps, args.repeats, None, prepack_linears=True)
        ratios[model], steps_ms[model] = plain["step_s"] / packed["step_s"], plain["step_s"] * 1e3
        diff = np.abs(np.round(plain["image"] * 255) - np.round(packed["image"] * 255)).max()
        lines.append(f"| {model} | {plain['step_s'] * 1e3:.1f} ms | {packed['step_s'] * 1e3:.1f} ms | "
                     f"{ratios[model]:.2f}x | {plain['request_s']:.2f} s | {packed['request_s']:.2f} s | "
                     f"{plain['request_s'] / packed['request_s']:.2f}x | {diff:.0f} | {os.getloadavg()[0]:.2f} |")
    missed = [m for m, r in ratios.items() if r < 1.3]
    rows, per_step = bench_rows(args, paths, kwargs)
    lines += ["", f"Goal >= 1.3x on the DiT step: {'met' if not missed else 'missed for ' + ', '.join(missed)} "
                  f"({', '.join(f'{m} {r:.2f}x' for m, r in ratios.items())}; {os.cpu_count()} cores, shared). "
                  "What packing can win is bounded by the block linears' share of the step. Timed alone (table "
                  "below, the zoo request's steps), they take " + "; ".join(
                      f"{m} {plain_ms:.1f} ms a step unpacked and {packed_ms:.1f} ms packed (so at most "
                      f"{steps_ms[m] / (steps_ms[m] - plain_ms + packed_ms):.2f}x on its {steps_ms[m]:.1f} ms step)"
                      for m, (plain_ms, packed_ms) in per_step.items())
              + ". The rest of a step (attention, norms, RoPE, activations) is untouched by packing.",
              ""] + rows
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section("Diffusion: prepacked linears on CPU", "benchmarks/bench_prepack.py", body)


if __name__ == "__main__":
    main()
