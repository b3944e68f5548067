"""AR decode with CUDA graphs (`compile: true`) vs the same engine eager, in one script.

On the zoo's qwen2-llm (tiny, small), on CUDA (`compile: true` is refused on CPU), both
engines built through the deploy config a user writes, in the same process and dtype:

- 1 request x 64 new tokens (greedy, min_tokens = max_tokens): batch-1 decode, where a
  step's kernel launches cost the most next to its math;
- 8 requests x 64 new tokens, prompts of 8-40 tokens (bench_ar.py's workload): the
  decode steps run at batch 8.

Each is warmed up once, then timed `--repeats` times interleaved; the best run counts.
Also printed: the start-up time of each engine (the graphs' capture is in it) and
whether the tokens are the same. Prints a markdown table and writes it under
"## AR CUDA graphs" in benchmarks/RESULTS.md (other sections are kept).

    python benchmarks/bench_ar_cuda_graphs.py --device cuda [--dtype bfloat16] [--sizes tiny small]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench_ar import NEW_TOKENS, NUM_REQUESTS, prompts, run_ours
from common import add_device_args, synchronize, write_section

ROOT = Path(__file__).resolve().parent.parent


def bench_size(size: str, repeats: int, device: str, dtype: str) -> dict:
    from transformers import AutoTokenizer

    from omnistage.ar.sampling_params import SamplingParams
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.config.spec import StageSpec
    from omnistage.engine.factory import create_engine
    from omnistage.testing import ensure

    path = str(ensure("qwen2-llm", size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    ids = prompts(AutoTokenizer.from_pretrained(path))
    stage = StageSpec(id=0, name="llm", kind="ar", output="text", final_output=True)
    engines, startup = {}, {}
    for name, compile_ in (("eager", False), ("graphs", True)):
        t0 = time.perf_counter()
        engines[name] = create_engine(path, stage, StageDeployConfig(
            max_num_seqs=NUM_REQUESTS, dtype=dtype, devices=(device,), compile=compile_))
        synchronize(device)
        startup[name] = time.perf_counter() - t0
    params = SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0)
    cases = {"1 x 64": ids[-1:], f"{NUM_REQUESTS} x 64": ids}
    best = {(case, name): float("inf") for case in cases for name in engines}
    outputs = {}
    for (case, name) in best:  # warm-up
        outputs[case, name] = run_ours(engines[name], cases[case], params)
    for _ in range(repeats):
        for (case, name) in best:
            t0 = time.perf_counter()
            run_ours(engines[name], cases[case], params)
            synchronize(device)
            best[case, name] = min(best[case, name], time.perf_counter() - t0)
    graphs = engines["graphs"].runner.static_decode
    row = {"size": size, "device": device, "dtype": dtype, "startup": startup, "num_graphs": len(graphs.graphs),
           "cases": {}}
    for case, case_ids in cases.items():
        total = len(case_ids) * NEW_TOKENS
        same = sum(a == b for a, b in zip(outputs[case, "graphs"], outputs[case, "eager"]))
        row["cases"][case] = {"eager": total / best[case, "eager"], "graphs": total / best[case, "graphs"],
                              "same": f"{same}/{len(case_ids)}"}
    assert graphs.num_replays > 0, "no decode step replayed a graph"
    for engine in engines.values():
        engine.close()
    return row


def table(rows: list[dict]) -> str:
    device, dtype = (rows[0]["device"], rows[0]["dtype"]) if rows else ("cuda", "float32")
    lines = [
        f"Greedy, min_tokens = max_tokens = {NEW_TOKENS}, {dtype}, {device}, torch {torch.__version__}, best of "
        "the timed runs; both engines are the native AR engine, `compile: false` vs `compile: true`, "
        f"max_num_seqs={NUM_REQUESTS}. Start-up includes loading the model (and, with graphs, capturing them).",
        "",
        "| model | requests x tokens | eager (tok/s) | CUDA graphs (tok/s) | graphs / eager | same tokens "
        "| start-up eager / graphs (graphs captured) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        for case, c in r["cases"].items():
            lines.append(f"| qwen2-llm {r['size']} | {case} | {c['eager']:.0f} | {c['graphs']:.0f} | "
                         f"{c['graphs'] / c['eager']:.2f}x | {c['same']} | {r['startup']['eager']:.2f} s / "
                         f"{r['startup']['graphs']:.2f} s ({r['num_graphs']}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    add_device_args(parser)
    args = parser.parse_args()
    if torch.device(args.device).type != "cuda":
        parser.error(f"CUDA graphs need a CUDA device (--device cuda), not {args.device!r}")
    rows = [bench_size(size, args.repeats, args.device, args.dtype) for size in args.sizes]
    body = table(rows)
    print(body)
    if not args.no_write:
        write_section("AR CUDA graphs", "benchmarks/bench_ar_cuda_graphs.py", body)


if __name__ == "__main__":
    main()
