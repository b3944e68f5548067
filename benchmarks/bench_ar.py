"""AR engine throughput vs transformers `generate`, in one script.

8 requests x 64 new tokens (greedy, min_tokens = max_tokens = 64 so every request runs
the full length), prompts of 8-40 tokens, on the zoo's qwen2-llm (tiny, small), fp32 on CPU unless
`--device` / `--dtype` say otherwise (ours and `generate` always share them):

- ours: `AREngine`, all 8 submitted at once, stepped until done;
- sequential: 8 `generate` calls, one prompt each (what a server without batching does);
- batched: one left-padded `generate` of all 8 (the ceiling for a fixed batch).

Each is warmed up once, then timed `--repeats` times interleaved; the best run counts.
Prints a markdown table and writes it under "## AR" in benchmarks/RESULTS.md (other
sections are kept).

    .venv/bin/python benchmarks/bench_ar.py [--sizes tiny small] [--repeats 3]
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import torch

from common import add_device_args, synchronize, torch_dtype, write_section

ROOT = Path(__file__).resolve().parent.parent
NUM_REQUESTS, NEW_TOKENS = 8, 64
WORDS = ("The quick brown fox jumps over the lazy dog. Once upon a time there was a little robot who "
         "loved to paint a watercolor painting of a mountain lake at sunrise").split()


def prompts(tokenizer) -> list[list[int]]:
    """8 prompts of 8..40 tokens."""
    out = []
    for i in range(NUM_REQUESTS):
        n = 8 + i * 32 // (NUM_REQUESTS - 1)
        ids = tokenizer(" ".join(WORDS * 3))["input_ids"]
        out.append(ids[i:i + n])
    return out


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_ours(engine, prompt_ids, params) -> list[list[int]]:
    from omnistage.core.types import StageRequest

    for i, ids in enumerate(prompt_ids):
        engine.add_request(StageRequest(f"r{i}", {"prompt_token_ids": ids}, params))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.payload.token_ids
    return [done[f"r{i}"] for i in range(len(prompt_ids))]


def run_sequential(model, prompt_ids, gen_kwargs) -> list[list[int]]:
    outs = []
    for ids in prompt_ids:
        x = torch.tensor([ids], device=model.device)
        outs.append(model.generate(x, attention_mask=torch.ones_like(x), **gen_kwargs)[0, len(ids):].tolist())
    return outs


def run_batched(model, prompt_ids, gen_kwargs, pad_id: int) -> list[list[int]]:
    width = max(len(p) for p in prompt_ids)
    x = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompt_ids], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=model.device)
    out = model.generate(x, attention_mask=mask, **gen_kwargs)
    return out[:, width:].tolist()


def bench_size(size: str, repeats: int, device: str = "cpu", dtype: str = "float32") -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omnistage.ar.engine import AREngine
    from omnistage.ar.sampling_params import SamplingParams
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.testing import ensure

    path = str(ensure("qwen2-llm", size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    tok = AutoTokenizer.from_pretrained(path)
    ids = prompts(tok)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype),
                                                 attn_implementation="sdpa").to(device).eval()
    gen_kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                      pad_token_id=tok.pad_token_id)
    engine = AREngine(path, config=StageDeployConfig(max_num_seqs=NUM_REQUESTS, dtype=dtype, devices=(device,)))
    params = SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0)

    runs = {
        "ours": lambda: run_ours(engine, ids, params),
        "sequential": lambda: run_sequential(model, ids, gen_kwargs),
        "batched": lambda: run_batched(model, ids, gen_kwargs, tok.pad_token_id),
    }
    best = {name: float("inf") for name in runs}
    best_cpu = dict(best)
    outputs = {}
    with torch.inference_mode():
        for name, fn in runs.items():  # warm-up
            outputs[name] = fn()
        for _ in range(repeats):
            for name, fn in runs.items():
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                synchronize(device)
                best[name] = min(best[name], time.perf_counter() - t0)
                best_cpu[name] = min(best_cpu[name], time.process_time() - c0)
    assert all(len(o) == NEW_TOKENS for o in outputs["ours"]), "every request must generate NEW_TOKENS"
    same = sum(a == b for a, b in zip(outputs["ours"], outputs["sequential"]))
    engine.close()
    total = NUM_REQUESTS * NEW_TOKENS
    return {
        "size": size,
        "device": device,
        "dtype": dtype,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "tok_s": {k: total / v for k, v in best.items()},
        "secs": best,
        "cpu_secs": best_cpu,
        "same_as_sequential": same,
        "peak_rss_mb": peak_rss_mb(),
    }


def table(rows: list[dict]) -> str:
    device, dtype = (rows[0]["device"], rows[0]["dtype"]) if rows else ("cpu", "float32")
    where = "fp32, CPU" if (device, dtype) == ("cpu", "float32") else f"{dtype}, {device}"
    lines = [
        f"{NUM_REQUESTS} requests x {NEW_TOKENS} new tokens (greedy, min_tokens={NEW_TOKENS}), prompts 8-40 tokens, "
        f"{where}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), best of the timed runs. "
        "Throughput is wall-clock; ratios are given by wall clock and by process CPU time (with one thread, CPU "
        "time is what the run costs when the machine is shared with other work).",
        "",
        "| model | params | ours (tok/s) | 8x sequential `generate` (tok/s) | padded batch `generate` (tok/s) "
        "| ours / sequential, wall (cpu) — goal >= 5 | ours / batched, wall (cpu) — goal >= 0.8 "
        "| same tokens as `generate` | peak RSS (process) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        t, s, c = r["tok_s"], r["secs"], r["cpu_secs"]
        lines.append(
            f"| qwen2-llm {r['size']} | {r['params_m']:.2f} M | {t['ours']:.0f} | {t['sequential']:.0f} | "
            f"{t['batched']:.0f} | {s['sequential'] / s['ours']:.2f}x ({c['sequential'] / c['ours']:.2f}x) | "
            f"{s['batched'] / s['ours']:.2f} ({c['batched'] / c['ours']:.2f}) | "
            f"{r['same_as_sequential']}/{NUM_REQUESTS} | {r['peak_rss_mb']:.0f} MB |")
    return "\n".join(lines)



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: on a shared machine, OpenMP spin-waits dominate a tiny model)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    add_device_args(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [bench_size(size, args.repeats, args.device, args.dtype) for size in args.sizes]
    body = table(rows)
    print(body)
    if not args.no_write:
        write_section("AR", "benchmarks/bench_ar.py", body)


if __name__ == "__main__":
    main()
