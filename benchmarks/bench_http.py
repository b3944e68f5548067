"""What HTTP serving adds to one request's latency: in-process `Omni` vs the server.

For the zoo's small Z-Image and Qwen-Image (256x256, 4 steps, CFG as the pipeline's
defaults, fp32), one request at a time:

- in-process: `Omni(path).generate([prompt], DiffusionParams(...))`;
- HTTP: `POST /v1/images/generations` (b64 PNG) to `omnistage serve` in a subprocess,
  timed on the client, so it includes routing, validation, PNG + base64 encoding and JSON.

Both are loaded side by side and requests alternate between them (after a warm-up each),
so machine drift hits both equally; the median latency counts. Goal: HTTP adds <= 10%.

    .venv/bin/python benchmarks/bench_http.py [--models z-image qwen-image] [--repeats 7]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time

import httpx

from common import PeakRSS, ROOT, write_section

PROMPT = "a watercolor painting of a mountain lake at sunrise"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(path: str, *args: str, timeout_s: float = 180.0) -> tuple[subprocess.Popen, str]:
    """`omnistage serve path --port P *args` in a subprocess, once /health answers (within `timeout_s`)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "omnistage.entrypoints.cli", "serve", path, "--port", str(port),
                             *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
        if proc.poll() is not None:
            raise RuntimeError(f"server for {path} exited with {proc.returncode}")
    proc.kill()
    raise RuntimeError(f"server did not become healthy in {timeout_s:g} s")


def bench(model: str, size: str, side: int, repeats: int) -> dict:
    from omnistage import DiffusionParams, Omni
    from omnistage.testing import ensure

    path = str(ensure(model, size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    params = DiffusionParams(height=side, width=side, num_inference_steps=4, seed=0)
    body = {"prompt": PROMPT, "size": f"{side}x{side}", "num_inference_steps": 4, "seed": 0,
            "response_format": "b64_json"}
    proc, url = start_server(path)
    try:
        with PeakRSS(children=False) as own_rss, PeakRSS(proc.pid) as server_rss, Omni(path) as omni, \
                httpx.Client(base_url=url, timeout=300) as client:
            def in_process() -> float:
                t0 = time.perf_counter()
                omni.generate([PROMPT], params, use_tqdm=False)
                return time.perf_counter() - t0

            def over_http() -> float:
                t0 = time.perf_counter()
                resp = client.post("/v1/images/generations", json=body)
                resp.raise_for_status()
                return time.perf_counter() - t0

            in_process(), over_http()  # warm-up
            local, remote = [], []
            for _ in range(repeats):
                local.append(in_process())
                remote.append(over_http())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    med_local, med_remote = statistics.median(local), statistics.median(remote)
    return {"model": f"{model} ({size}, {side}x{side})", "in_process_s": med_local, "http_s": med_remote,
            "overhead": med_remote / med_local - 1, "rss_in_process_mib": own_rss.peak_mib,
            "rss_server_mib": server_rss.peak_mib}


def table(rows: list[dict]) -> str:
    lines = ["| model | in-process median (s) | HTTP median (s) | HTTP / in-process | goal | "
             "peak RSS in-process (MiB) | peak RSS server (MiB) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['in_process_s']:.3f} | {r['http_s']:.3f} | "
                     f"{1 + r['overhead']:.3f}x ({r['overhead'] * 100:+.1f}%) | <= 1.10x | "
                     f"{r['rss_in_process_mib']:.0f} | {r['rss_server_mib']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["z-image", "qwen-image"])
    parser.add_argument("--size", default="small", choices=["tiny", "small"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    side = {"tiny": 64, "small": 256}[args.size]
    rows = [bench(m, args.size, side, args.repeats) for m in args.models]
    body = table(rows) + (
        "\n\nOne request at a time, median of alternating runs. The HTTP path adds request "
        "parsing and validation, PNG encoding and base64 in the server, and JSON decoding "
        "in the client; the in-process RSS is this script's own process (the server is measured "
        "separately, with its children).")
    print(body)
    if not args.no_write:
        write_section("HTTP serving overhead", "benchmarks/bench_http.py", body)


if __name__ == "__main__":
    main()
