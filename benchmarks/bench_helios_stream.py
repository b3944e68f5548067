"""Helios over WS /v1/realtime/video: how soon the first MP4 chunk arrives, as a fraction of the
whole video.

One `omnistage serve` of the zoo's Helios in a subprocess. Each session asks for a video of N
chunks (two latent frames each) and times, from sending `session.start`: the first binary
fragment (the first chunk's fMP4 bytes) and `session.done` (the whole video streamed). The
baseline in the same run is the same video from `POST /v1/videos/sync`, which answers only once
the video is whole. Statistic: the median over `--repeats` sessions (and sync calls) per N,
wall clock. Goal (issue 35): first chunk <= 1 / N + 10% of the whole video.

    .venv/bin/python benchmarks/bench_helios_stream.py [--size tiny] [--repeats 5] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import httpx
from websockets.sync.client import connect

from bench_http import start_server
from common import ROOT, write_section

CHUNK_COUNTS = (2, 4)
FRAMES_PER_CHUNK = 5  # two latent frames: 4 * 2 - 3 frames; the video is trimmed to 4k + 1 at the end


def request(num_chunks: int, seed: int) -> dict:
    return {"prompt": "a wave on a beach", "size": "64x64", "fps": 8, "num_frames": FRAMES_PER_CHUNK * num_chunks,
            "num_inference_steps": 4, "guidance_scale": 1.0, "seed": seed, "num_latent_frames_per_chunk": 2,
            "max_sequence_length": 16}


def one_stream(url: str, num_chunks: int, seed: int) -> tuple[float, float, int]:
    """(seconds to the first chunk's bytes, seconds to session.done, chunks received)."""
    with connect(url.replace("http", "ws") + "/v1/realtime/video", max_size=None) as ws:
        start = time.perf_counter()
        ws.send(json.dumps({"type": "session.start", "format": "m4s", **request(num_chunks, seed)}))
        first, chunks = None, 0
        while True:
            message = ws.recv(timeout=600)
            if isinstance(message, bytes):
                chunks += 1
                first = first if first is not None else time.perf_counter() - start
                continue
            event = json.loads(message)
            if event["type"] == "error":
                raise RuntimeError(event)
            if event["type"] == "session.done":
                return first, time.perf_counter() - start, chunks


def one_sync(url: str, num_chunks: int, seed: int) -> float:
    form = {k: str(v) for k, v in request(num_chunks, seed).items()}
    start = time.perf_counter()
    resp = httpx.post(url + "/v1/videos/sync", data=form, timeout=600)
    resp.raise_for_status()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from omnistage.testing import ensure

    path = str(ensure("helios", size=args.size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    proc, url = start_server(path)
    rows = []
    try:
        one_stream(url, 1, seed=999)  # warm-up: first-call costs
        for n in CHUNK_COUNTS:
            streams, syncs = [], []
            for r in range(args.repeats):  # interleaved, so load changes touch both alike
                streams.append(one_stream(url, n, seed=r))
                syncs.append(one_sync(url, n, seed=r))
            first = statistics.median(s[0] for s in streams)
            whole = statistics.median(s[1] for s in streams)
            chunks = int(statistics.median(s[2] for s in streams))
            rows.append((n, chunks, first, whole, statistics.median(syncs)))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    lines = [f"helios ({args.size}), 64 x 64, 4 steps, two latent frames ({FRAMES_PER_CHUNK} frames) a chunk; median of "
             f"{args.repeats} sessions and sync calls per row, interleaved; wall clock; load average "
             f"{os.getloadavg()[0]:.2f} at the end.", "",
             "| chunks | first chunk (s) | whole stream (s) | sync video (s) | first / whole stream | first / sync "
             "| goal: <= 1/N + 10% |", "|---|---|---|---|---|---|---|"]
    verdicts = []
    for n, chunks, first, whole, sync in rows:
        goal = 1 / n + 0.10
        met = first / sync <= goal
        verdicts.append(met)
        lines.append(f"| {chunks} | {first:.3f} | {whole:.3f} | {sync:.3f} | {first / whole:.2f} | {first / sync:.2f} "
                     f"| {goal:.2f}: {'met' if met else '**missed**'} |")
    body = "\n".join(lines) + "\n\n" + (
        f"**Goal (first chunk <= 1/N + 10% of the whole video, against the sync answer): "
        f"{'met' if all(verdicts) else 'missed'} at every N in this run.**" if all(verdicts) or not any(verdicts) else
        "**Goal met at some N only (see the table).**")
    print(body)
    if not args.no_write:
        write_section("Helios: time to the first streamed chunk", "benchmarks/bench_helios_stream.py", body)


if __name__ == "__main__":
    main()
