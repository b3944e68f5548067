"""`omnistage bench serve`: load-test a running server through its OpenAI routes."""

from __future__ import annotations

import argparse
import json
import math
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark a running server")
    sub = p.add_subparsers(dest="bench_command", metavar="BENCH_COMMAND", required=True)
    s = sub.add_parser("serve", help="send a load to a server and report latency and throughput")
    s.add_argument("--base-url", default="http://127.0.0.1:8000")
    s.add_argument("--task", required=True, choices=["t2i", "edit", "t2v", "tts", "chat"])
    s.add_argument("--model", default=None, help="the `model` field to send (default: none)")
    s.add_argument("--num-prompts", type=int, default=8)
    s.add_argument("--max-concurrency", type=str, default="1",
                   help="in-flight cap; a comma list (e.g. 1,4,8) runs one pass per value")
    s.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (Poisson); default: all at once")
    s.add_argument("--warmup", type=int, default=1, help="requests sent first and not counted")
    s.add_argument("--dataset", default="random", help="'random' or a JSONL file with a 'prompt' per line")
    s.add_argument("--size", default="64x64")
    s.add_argument("--steps", type=int, default=None)
    s.add_argument("--frames", type=int, default=None)
    s.add_argument("--voice", default=None)
    s.add_argument("--max-tokens", type=int, default=64)
    s.add_argument("--extra-body", default="{}", help="JSON object merged into every request")
    s.add_argument("--api-key", default=None)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--output-json", default=None)
    s.add_argument("--plot", default=None, metavar="DIR", help="write latency CDF and throughput PNGs here")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from omnistage.bench.datasets import file_prompts, random_prompts
    from omnistage.bench.report import format_table, summarize, write_json, write_plots
    from omnistage.bench.runner import BenchConfig, run_benchmark
    from omnistage.bench.tasks import TaskOptions

    try:
        concurrencies = [int(c) for c in args.max_concurrency.split(",")]
        extra = json.loads(args.extra_body)
        if not isinstance(extra, dict):
            raise ValueError("--extra-body must be a JSON object")
        prompts = (random_prompts(args.num_prompts, args.seed) if args.dataset == "random"
                   else file_prompts(args.dataset, args.num_prompts))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    options = TaskOptions(model=args.model, size=args.size, steps=args.steps, frames=args.frames,
                          voice=args.voice, max_tokens=args.max_tokens, extra_body=extra)
    summaries = []
    for c in concurrencies:
        cfg = BenchConfig(base_url=args.base_url, task=args.task, prompts=prompts, options=options,
                          max_concurrency=c, request_rate=args.request_rate, warmup=args.warmup,
                          api_key=args.api_key, seed=args.seed)
        summary = summarize(run_benchmark(cfg))
        print(format_table(summary))
        summaries.append(summary)
    if args.output_json:
        write_json(summaries[0] if len(summaries) == 1 else {"runs": summaries}, args.output_json)
    if args.plot:
        for path in write_plots(summaries, args.plot):
            print(f"wrote {path}")
    return 0 if all(s["errors"] == 0 for s in summaries) else 1
