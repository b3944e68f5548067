"""Fused q/k/v and gate/up packed matmuls (core/cpu_linear.py) against one packed matmul per linear.

The zoo's qwen2-llm (small: 4 layers of 512), fp32, CPU, one thread: the transformers model with
its linears prepacked as an AR stage does (`prepack_linears(fuse=True)`: 4 oneDNN calls per layer)
against the same model packed linear by linear (`fuse=False`: 7 calls), two forwards each:

- decode-sized: 8 rows of one token (the linears of a batched decode step of 8 streams);
- a short prefill: 8 prompts of 24 tokens (the short-prompt case of bench_ar_paged.py).

The two models alternate call by call; each number is the median of `--repeats` calls' process
CPU time (with one thread, what a call takes on an idle core). Prints a markdown table (nothing
is written to RESULTS.md).

    .venv/bin/python benchmarks/bench_fused_linears.py [--size small] [--repeats 31]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from common import ROOT, machine_line

CASES = {"decode, 8 rows x 1 token": (8, 1), "prefill, 8 prompts x 24 tokens": (8, 24)}


def packed_model(path: str, fuse: bool):
    from transformers import AutoModelForCausalLM

    from omnistage.core.cpu_linear import prepack_linears

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prepack_linears(model, max_batch=8, fuse=fuse)
    return model


def cpu_ms(model, ids: torch.Tensor) -> float:
    start = time.process_time()
    model(input_ids=ids, use_cache=False, logits_to_keep=1)
    return (time.process_time() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="small")
    parser.add_argument("--repeats", type=int, default=31)
    args = parser.parse_args()
    from omnistage.testing import ensure

    torch.set_num_threads(1)
    path = str(ensure("qwen2-llm", size=args.size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    models = {"fused": packed_model(path, True), "per linear": packed_model(path, False)}
    load_start = os.getloadavg()[0]
    rows = []
    with torch.inference_mode():
        for case, shape in CASES.items():
            ids = torch.randint(3, 1000, shape)
            for model in models.values():  # warm-up: oneDNN builds its primitives on the first call
                cpu_ms(model, ids)
            times = {name: [] for name in models}
            for _ in range(args.repeats):
                for name, model in models.items():
                    times[name].append(cpu_ms(model, ids))
            fused, single = (statistics.median(times[name]) for name in models)
            rows.append(f"| {args.size} | {case} | {fused:.2f} | {single:.2f} | **{single / fused:.2f}x** |")
    print(f"{machine_line()}; load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
          f"median of {args.repeats} calls (ms of process CPU time)\n")
    print("| model | forward | fused (ms) | per linear (ms) | speed-up |\n| --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
