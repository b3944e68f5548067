"""Requests per second with `--api-server-count 2` vs 1, when answers are big and cheap to make.

The zoo's tiny Z-Image at one denoising step makes a WxW image; the answer is a b64 PNG of
it (noise, so the PNG hardly compresses: 0.2 MB of JSON at 256x256). With one process the
engine and the PNG, base64 and JSON encoding share one interpreter; with two API server
processes the encoding runs beside it. The servers run torch on one thread
(OMP_NUM_THREADS=1, as an engine on an accelerator leaves the CPU to the server): on the tiny
model the engine still takes about 5 times the encoding's time (0.24 s vs 0.05 s at 256x256,
measured alone), so the gain is bounded well below 2x.

Both servers are loaded side by side and measured in alternating rounds (so machine drift
hits both equally): each round sends `--requests` requests from `--concurrency` client
threads, each on its own connection, and counts requests per second; the median of
`--rounds` rounds counts, and the ratio is 2 processes over 1.

    .venv/bin/python benchmarks/bench_frontends.py [--side 256] [--concurrency 8] [--requests 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from bench_http import start_server
from common import ROOT, write_section


def round_rps(url: str, body: dict, requests: int, concurrency: int) -> float:
    def one(_: int) -> int:
        with httpx.Client(base_url=url, timeout=600) as client:  # a connection of its own, as a fresh client
            resp = client.post("/v1/images/generations", json=body)
            resp.raise_for_status()
            return len(resp.content)  # not parsed: the client's CPU is the servers' too

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        sizes = list(pool.map(one, range(requests)))
    assert min(sizes) > 0
    return requests / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from omnistage.testing import ensure

    path = str(ensure("z-image", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    body = {"prompt": "x", "size": f"{args.side}x{args.side}", "num_inference_steps": 1, "response_format": "b64_json"}
    os.environ["OMP_NUM_THREADS"] = "1"  # the servers' torch threads (see the module docstring)
    load_before = os.getloadavg()[0]
    servers = {count: start_server(path, "--api-server-count", str(count), "--max-queued-requests", "256",
                                   "--log-level", "warning") for count in (1, 2)}
    rps: dict[int, list[float]] = {1: [], 2: []}
    try:
        for count, (_, url) in servers.items():
            round_rps(url, body, args.concurrency, args.concurrency)  # warm-up
        for _ in range(args.rounds):
            for count, (_, url) in servers.items():
                rps[count].append(round_rps(url, body, args.requests, args.concurrency))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    load_after = os.getloadavg()[0]
    med = {count: statistics.median(values) for count, values in rps.items()}
    body_md = (
        f"Zoo Z-Image (tiny), 1 step, {args.side}x{args.side}, b64 PNG answers, servers at 1 torch thread; "
        f"{args.requests} requests from "
        f"{args.concurrency} client threads per round (a connection each), {args.rounds} alternating rounds, "
        f"median requests/s. Load average {load_before:.2f} before, {load_after:.2f} after ({os.cpu_count()} "
        "cores, shared with other jobs).\n\n"
        "| --api-server-count | requests/s per round | median requests/s | vs 1 |\n| --- | --- | --- | --- |\n"
        + "".join(f"| {count} | {', '.join(f'{v:.2f}' for v in rps[count])} | {med[count]:.2f} | "
                  f"{med[count] / med[1]:.2f}x |\n" for count in (1, 2)))
    print(body_md)
    if not args.no_write:
        write_section("API server processes (--api-server-count)", "benchmarks/bench_frontends.py", body_md)


if __name__ == "__main__":
    main()
