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

With `--stage ar`: a text LLM on the native AR engine (`AREngine`, the zoo's qwen2-llm), `--batch`
requests x 64 new tokens (greedy, every request the full length) submitted at once, each with no
adapter, all one adapter, or each its own adapter (peft rank-8 LoRAs on every linear layer of the
decoder, `omnistage.testing.lora.build_peft_lora`, all loaded ahead): generated tokens per second, and
the process CPU time against the batch without adapters (one torch thread, so CPU time is what the
run costs on a shared machine); best of `--repeats`, interleaved. Writes "## LoRA adapters on an AR
stage".

    .venv/bin/python benchmarks/bench_lora.py [--model z-image] [--size small] [--repeats 5]
    .venv/bin/python benchmarks/bench_lora.py --stage ar [--model qwen2-llm] [--size small] [--batch 8]
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


AR_NEW_TOKENS = 64
AR_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def ar_requests(tokenizer, names: list[str | None], tag: str) -> list:
    from omnistage.ar.sampling_params import SamplingParams
    from omnistage.core.types import StageRequest

    text = "The quick brown fox jumps over the lazy dog. Once upon a time there was a little robot " * 3
    ids = tokenizer(text)["input_ids"]
    return [StageRequest(f"{tag}{i}", {"prompt_token_ids": ids[i:i + 8 + 4 * i]},
                         SamplingParams(max_tokens=AR_NEW_TOKENS, min_tokens=AR_NEW_TOKENS, temperature=0.0,
                                        lora=None if name is None else {"name": name}))
            for i, name in enumerate(names)]


def bench_ar(args) -> None:
    import torch

    from omnistage.ar.engine import AREngine
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.testing import ensure
    from omnistage.testing.lora import build_peft_lora

    torch.set_num_threads(1)
    load_start = os.getloadavg()[0]
    path = ensure(args.model, size=args.size)
    tmp = Path(tempfile.mkdtemp(prefix="bench-ar-lora-"))
    adapters = {f"a{i}": str(build_peft_lora(path, tmp / f"a{i}", AR_TARGETS, rank=8, alpha=16, seed=i))
                for i in range(args.batch)}
    config = StageDeployConfig(devices=("cpu",), dtype="float32", max_num_seqs=args.batch, lora_adapters=adapters)
    engine = AREngine(str(path), config=config)
    kinds = {"no adapter": [None] * args.batch, "one adapter": ["a0"] * args.batch,
             "mixed adapters": list(adapters)}
    wall: dict[str, list[float]] = {kind: [] for kind in kinds}
    cpu: dict[str, list[float]] = {kind: [] for kind in kinds}
    try:
        for kind, names in kinds.items():  # warm-up
            run(engine, ar_requests(engine.model.tokenizer, names, f"w{kind[:3]}"))
        for r in range(args.repeats):  # interleaved, so load changes hit every kind alike
            for kind, names in kinds.items():
                engine.block_manager.reset_prefix_cache()
                cpu_start = time.process_time()
                wall[kind].append(run(engine, ar_requests(engine.model.tokenizer, names, f"{kind[:3]}{r}-")))
                cpu[kind].append(time.process_time() - cpu_start)
    finally:
        engine.close()
    load_end = os.getloadavg()[0]
    tokens = args.batch * AR_NEW_TOKENS
    best_cpu = {kind: min(t) for kind, t in cpu.items()}
    body = (f"{args.model} ({args.size}), {args.batch} requests x {AR_NEW_TOKENS} new tokens (greedy, full length), "
            f"prompts of 8-{8 + 4 * (args.batch - 1)} tokens, fp32 on cpu, 1 torch thread; peft rank-8 LoRAs "
            f"(alpha 16) on every linear layer of the decoder, loaded ahead (`lora_adapters`); best of "
            f"{args.repeats}, interleaved. Taken under load: other jobs shared the 2 cores (load average (1 min) "
            f"{load_start:.1f} at the start, {load_end:.1f} at the end); the CPU-time ratio is the figure to read.\n\n"
            f"| batch | tok/s (wall) | process CPU s | CPU time vs no adapter | vs one adapter |\n"
            f"| --- | --- | --- | --- | --- |\n")
    for kind in kinds:
        body += (f"| {kind} | {tokens / min(wall[kind]):.0f} | {best_cpu[kind]:.3f} | "
                 f"{best_cpu[kind] / best_cpu['no adapter']:.2f}x | {best_cpu[kind] / best_cpu['one adapter']:.2f}x |\n")
    print(body)
    write_section("LoRA adapters on an AR stage", "benchmarks/bench_lora.py", body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=("diffusion", "ar"), default="diffusion")
    parser.add_argument("--model", default=None, help="default: z-image (diffusion), qwen2-llm (ar)")
    parser.add_argument("--size", default="small")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=None, help="default: 4 (diffusion), 8 (ar)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.stage == "ar":
        args.model, args.batch = args.model or "qwen2-llm", args.batch or 8
        return bench_ar(args)
    args.model, args.batch = args.model or "z-image", args.batch or 4

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
