"""LoRA adapters loaded by path while serving (deploy `max_loras`): what a hot load costs, and
what a step-mode batch of requests with different adapters costs against one whose requests
share one adapter, in one script on one `DiffusionEngine` (uni executor, step mode).

- hot load: `load_lora_adapter(name, path)` (the POST /v1/lora_adapters call; a request's
  first use pays the same), each time a new name, median of `--repeats`, against the median
  time of one request alone on the same engine (the baseline: how many requests' worth of
  time a load costs);
- mixed batch: `--batch` requests in one step-mode batch, all naming one adapter, against
  the same requests each naming its own adapter (all loaded ahead, so no load is timed),
  and against requests without an adapter; median of `--repeats` each, interleaved.

Writes "## LoRA adapters loaded by path" in benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/bench_lora.py [--model z-image] [--size small] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from common import write_section


def requests(kwargs: dict, names: list[str | None], tag: str) -> list:
    from omnistage.core.types import StageRequest
    from omnistage.diffusion.params import DiffusionParams, LoraRequest

    fields = {k: v for k, v in kwargs.items() if k in DiffusionParams.model_fields}
    extras = {k: v for k, v in kwargs.items() if k not in DiffusionParams.model_fields and k != "prompt"}
    return [StageRequest(f"{tag}{i}", kwargs["prompt"],
                         DiffusionParams(seed=i, extras=extras, **fields,
                                         lora=None if name is None else LoraRequest(name=name)))
            for i, name in enumerate(names)]


def run(engine, batch: list) -> float:
    start = time.perf_counter()
    for request in batch:
        engine.add_request(request)
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.error is None, out.error
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="z-image")
    parser.add_argument("--size", default="small")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.engine import DiffusionEngine
    from omnistage.testing import call_kwargs, ensure
    from omnistage.testing.lora import build_lora

    load_start = os.getloadavg()[0]
    path = ensure(args.model, size=args.size)
    kwargs = dict(call_kwargs(args.model, args.size), num_inference_steps=args.steps)
    tmp = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    files = [str(build_lora(path, tmp / f"a{i}.safetensors", seed=i)) for i in range(args.batch)]
    config = StageDeployConfig(max_loras=args.batch + args.repeats, step_execution=True, max_num_seqs=args.batch)
    engine = DiffusionEngine(str(path), config=config)
    try:
        run(engine, requests(kwargs, [None], "warm"))
        one = statistics.median(run(engine, requests(kwargs, [None], f"one{r}-")) for r in range(args.repeats))
        loads = []
        for r in range(args.repeats):
            start = time.perf_counter()
            engine.load_lora_adapter(f"hot{r}", files[r % len(files)])
            loads.append(time.perf_counter() - start)
        for i, file in enumerate(files):
            engine.load_lora_adapter(f"a{i}", file)
        kinds = {"no adapter": [None] * args.batch, "one adapter": ["a0"] * args.batch,
                 "mixed adapters": [f"a{i}" for i in range(args.batch)]}
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        for r in range(args.repeats):  # interleaved, so load changes hit every kind alike
            for kind, names in kinds.items():
                times[kind].append(run(engine, requests(kwargs, names, f"{kind[:3]}{r}-")))
    finally:
        engine.close()
    load_end = os.getloadavg()[0]

    load = statistics.median(loads)
    median = {kind: statistics.median(t) for kind, t in times.items()}
    body = (f"{args.model} ({args.size}), {args.steps} steps, zoo call defaults, float32 on cpu; step mode, "
            f"uni executor; rank-2 LoRA on the attention projections (omnistage.testing.lora); median of "
            f"{args.repeats}. Taken under load: other jobs shared the 2 cores (load average (1 min) "
            f"{load_start:.1f} at the start, {load_end:.1f} at the end).\n\n"
            f"| measure | median seconds | ratio |\n| --- | --- | --- |\n"
            f"| one request, no adapter (baseline) | {one:.3f} | 1.00x |\n"
            f"| hot load (`load_lora_adapter`, new name) | {load:.3f} | {load / one:.2f}x of one request |\n")
    for kind in kinds:
        body += (f"| batch of {args.batch}, {kind} | {median[kind]:.3f} | "
                 f"{median[kind] / median['one adapter']:.2f}x of one adapter |\n")
    print(body)
    write_section("LoRA adapters loaded by path", "benchmarks/bench_lora.py", body)


if __name__ == "__main__":
    main()
