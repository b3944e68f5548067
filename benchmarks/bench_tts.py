"""TTS serving: CSM behind `omnistage serve`, loaded by the `omnistage bench serve` client.

Server: the zoo's tiny CSM (talker = backbone + depth decoder, codec = Mimi, both at
max_num_seqs 8, inline), the model card's sampling (temperature 0.9, top-k 50), and the
talker held to `--frames` frames per request (64 = 5.12 s of 24 kHz audio, about what a
two-sentence input takes; the random weights never emit the EOS frame). The server runs
with `--threads` torch threads (OMP_NUM_THREADS of its process).

Client: `omnistage.bench` streams POST /v1/audio/speech (stream_format=audio,
response_format=pcm) with two-sentence inputs at concurrency 1, 4 and 8, after a warm-up
request, and times each answer: time to first audio packet (TTFP), latency, real-time
factor (latency / audio seconds) and audio seconds produced per wall second.

Goals: audio per wall second at concurrency 8 >= 4x concurrency 1, and TTFP at
concurrency 1 <= 25% of the request's full latency.

It also measures, in process, how far the streamed waveform (chunks of 2, then 8 frames,
each decoded with the stream's carried state) is from transformers' one-shot Mimi
decode of the same frames. Writes the "TTS" section of benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/bench_tts.py [--frames 64] [--requests 4 8 16] [--threads 1] [--repeats 3] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import psutil

from common import PeakRSS, ROOT, write_section

PROMPTS = [
    "The sun rises in the east and sets in the west. Birds sing in the early morning light.",
    "Please take a seat and make yourself at home. The kettle is on and the tea will be ready soon.",
    "Our train leaves at half past nine from platform four. Do not forget your ticket and your coat.",
    "The library opens at eight on weekdays. On Sundays it stays closed for cleaning and repairs.",
    "Mix the flour with two eggs and a cup of milk. Let the batter rest for ten minutes before baking.",
    "It rained all night in the mountains. By noon the river had risen over the old stone bridge.",
    "Welcome to the museum of modern art. The guided tour starts in the main hall in five minutes.",
    "My neighbor plays the piano every evening. Sometimes I open the window just to listen to her.",
]
CONCURRENCY = (1, 4, 8)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(path: str, frames: int, threads: int, sampling: dict | None = None,
                 source: str | None = None, stages: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`sampling`: more default sampling params of the talker (stage 0) than `max_tokens=frames`;
    `source`: a checkout of omnistage to serve from (another revision, for a before/after); default this one;
    `stages`: more deploy fields by stage key (each stage's replace those above)."""
    overrides = {"0": {"default_sampling_params": {"max_tokens": frames, **(sampling or {})}}, "*": {"max_num_seqs": 8}}
    for key, fields in (stages or {}).items():
        overrides.setdefault(key, {}).update(fields)
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if source is not None:
        env["PYTHONPATH"] = source
    proc = subprocess.Popen([sys.executable, "-m", "omnistage.entrypoints.cli", "serve", path, "--port", str(port),
                             "--stage-overrides", json.dumps(overrides), "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=source)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise TimeoutError("the server did not become healthy")


def load(url: str, requests: list[int], repeats: int, server_pid: int, voice: str = "alloy") -> list[dict]:
    """One summary per concurrency level: the repeat with the most audio per wall second."""
    from omnistage.bench.report import summarize
    from omnistage.bench.runner import BenchConfig, run_benchmark
    from omnistage.bench.tasks import TaskOptions

    server = psutil.Process(server_pid)
    summaries = []
    for concurrency, num in zip(CONCURRENCY, requests):
        prompts = [{"prompt": PROMPTS[i % len(PROMPTS)]} for i in range(num)]
        cfg = BenchConfig(base_url=url, task="tts", prompts=prompts, options=TaskOptions(voice=voice),
                          max_concurrency=concurrency, warmup=1, show_progress=False)
        runs = []
        for _ in range(repeats):
            cpu = sum(server.cpu_times()[:2])
            summary = summarize(run_benchmark(cfg))
            summary["server_cpu_s"] = sum(server.cpu_times()[:2]) - cpu
            if summary["errors"]:
                raise RuntimeError(f"concurrency {concurrency}: {summary['first_errors']}")
            runs.append(summary)
        summary = max(runs, key=lambda s: s["audio_seconds_per_s"])
        summaries.append(summary)
        print(f"concurrency {concurrency}: {summary['completed']} requests, "
              f"TTFP p50 {summary['ttfp_p50_s']:.3f} s, latency p50 {summary['latency_p50_s']:.3f} s, "
              f"audio/wall {summary['audio_seconds_per_s']:.2f}, server CPU {summary['server_cpu_s']:.2f} s, "
              f"wall {summary['duration_s']:.2f} s", flush=True)
    return summaries


def family_args(doc: str, steps_flag: str, steps_help: str) -> argparse.Namespace:
    """The command line of a TTS family's bench (bench_higgs_audio, bench_voxcpm2, bench_moss_tts,
    bench_omnivoice, bench_fish_speech)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument(steps_flag, type=int, default=64, help=steps_help)
    p.add_argument("--requests", type=int, nargs=3, default=[4, 8, 16], help="requests timed at concurrency 1, 4, 8")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server and of the baseline")
    p.add_argument("--repeats", type=int, default=3, help="runs per level (and per baseline call); the best counts")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    return p.parse_args()


def serve_levels(path: str, frames: int, threads: int, requests: list[int], repeats: int,
                 sampling: dict | None = None, stages: dict | None = None) -> tuple[list[dict], float]:
    """`omnistage serve` on `path`, loaded at each concurrency level: (summaries, peak server RSS MiB)."""
    proc, url = start_server(path, frames, threads, sampling=sampling, stages=stages)
    try:
        with PeakRSS(proc.pid) as rss:
            summaries = load(url, requests, repeats, proc.pid)
    finally:
        proc.terminate()
        proc.wait(60)
    return summaries, rss.peak_mib


def one_at_a_time(speak, repeats: int) -> dict:
    """A reference's requests alone: `speak(i, text, r)` -> audio seconds of PROMPTS[i] (run r), each
    prompt the best of `repeats` after one warm-up; latency p50, RTF mean, audio per wall and CPU second."""
    speak(0, PROMPTS[0], 0)  # warm-up
    alone = []  # (wall s, CPU s, audio s) per prompt, each the best of `repeats`
    for i, text in enumerate(PROMPTS):
        runs = []
        for r in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            audio = speak(i, text, r)
            runs.append((time.perf_counter() - wall, time.process_time() - cpu, audio))
        alone.append(min(runs))
    audio = sum(a for _, _, a in alone)
    return {"latency_p50_s": float(np.median([w for w, _, _ in alone])),
            "rtf_mean": float(np.mean([w / a for w, _, a in alone if a])),
            "audio_per_s": audio / sum(w for w, _, _ in alone), "audio_per_cpu": audio / sum(c for _, c, _ in alone)}


def per_cpu(summary: dict) -> float:
    """Audio seconds per server CPU second of one level."""
    return summary["audio_seconds_per_s"] * summary["duration_s"] / summary["server_cpu_s"]


def versus_authors(ours1: dict, ours8: dict, base: dict) -> str:
    """The bullets that set a family served at concurrency 1 and 8 against its authors' one-at-a-time
    loop (`one_at_a_time`'s dict): time to first audio, audio per wall second and per CPU second."""
    return f"""- Time to first audio at concurrency 1 (p50): **{ours1['ttfp_p50_s']:.3f} s** vs the authors' whole request
  {base['latency_p50_s']:.3f} s (**{base['latency_p50_s'] / ours1['ttfp_p50_s']:.1f}x** sooner).
- Audio per wall second: concurrency 1 **{ours1['audio_seconds_per_s']:.3f}**
  (**{ours1['audio_seconds_per_s'] / base['audio_per_s']:.2f}x** the authors'), concurrency 8
  **{ours8['audio_seconds_per_s']:.3f}** (**{ours8['audio_seconds_per_s'] / base['audio_per_s']:.2f}x** the authors'
  one-at-a-time loop).
- Audio per CPU second: server at concurrency 1 **{per_cpu(ours1):.3f}**, at concurrency 8
  **{per_cpu(ours8):.3f}**, vs the authors' {base['audio_per_cpu']:.3f}."""


def level_rows(summaries: list[dict], audio_digits: int = 3, cpu_digits: int = 3) -> str:
    """The table rows (under `_VS`'s header) of one server's levels."""
    first = summaries[0]["audio_seconds_per_s"]
    return "\n".join(
        f"| {s['max_concurrency']} | {s['completed']} | {s['ttfp_p50_s']:.3f} | {s['ttfp_p95_s']:.3f} | "
        f"{s['latency_p50_s']:.3f} | {s['rtf_mean']:.3f} | {s['audio_seconds_per_s']:.{audio_digits}f} | "
        f"{s['audio_seconds_per_s'] / first:.2f}x | {per_cpu(s):.{cpu_digits}f} |" for s in summaries)


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def chunked_vs_whole(path: str, frames: int) -> dict:
    """Greedy codes from the talker; our streamed waveform vs transformers' one-shot Mimi decode."""
    import torch
    from transformers import CsmForConditionalGeneration

    from omnistage import Omni
    from omnistage.ar import SamplingParams
    from omnistage.ar.engine import AREngine
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.core.types import StageRequest
    from omnistage.models.csm import CSM

    greedy = SamplingParams(temperature=0, max_tokens=frames)
    talker = AREngine(path, CSM.stages[0], StageDeployConfig())
    talker.add_request(StageRequest("r", PROMPTS[0], greedy))
    while talker.has_unfinished_requests():
        for out in talker.step():
            codes = out.payload.extras["audio_codes"]
    talker.close()
    model = CsmForConditionalGeneration.from_pretrained(path).eval()
    with torch.inference_mode():
        whole = model.codec_model.decode(codes.T[None]).audio_values[0, 0].numpy()
    with Omni(path) as omni:
        streamed = omni.generate(PROMPTS[0], {"talker": greedy}, use_tqdm=False)[0].audio
    err = streamed - whole
    return {"max_abs": float(np.abs(err).max()), "peak": float(np.abs(whole).max()),
            "snr_db": float(10 * np.log10((whole ** 2).sum() / max((err ** 2).sum(), 1e-30))),
            "samples": len(whole)}


_VS = "vs concurrency 1 | audio s / server CPU s"


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=64, help="talker frames per request (12.5 per second of audio)")
    p.add_argument("--requests", type=int, nargs=3, default=[4, 8, 16],
                   help="requests timed at concurrency 1, 4, 8")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server process")
    p.add_argument("--repeats", type=int, default=3, help="runs per concurrency level; the best counts")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from omnistage.testing import ensure

    path = str(ensure("csm", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    proc, url = start_server(path, args.frames, args.threads)
    try:
        with PeakRSS(proc.pid) as rss:
            summaries = load(url, args.requests, args.repeats, proc.pid)
    finally:
        proc.terminate()
        proc.wait(60)
    diff = chunked_vs_whole(path, args.frames)

    base, top = summaries[0], summaries[-1]
    scale = top["audio_seconds_per_s"] / base["audio_seconds_per_s"]
    ttfp_share = base["ttfp_p50_s"] / base["latency_p50_s"]
    rows = "\n".join(
        f"| {s['max_concurrency']} | {s['completed']} | {s['ttfp_p50_s']:.3f} | {s['ttfp_p95_s']:.3f} | "
        f"{s['latency_p50_s']:.3f} | {s['rtf_mean']:.3f} | {s['audio_seconds_per_s']:.2f} | "
        f"{s['audio_seconds_per_s'] / base['audio_seconds_per_s']:.2f}x | "
        f"{s['completed'] * args.frames / 12.5 / s['server_cpu_s']:.1f} |" for s in summaries)
    body = f"""
Zoo csm (tiny), `omnistage serve` (talker and codec at max_num_seqs 8, inline, fp32, {args.threads} torch thread(s)),
loaded by `omnistage.bench` (`--task tts`: streamed `/v1/audio/speech`, `stream_format=audio`, `response_format=pcm`).
Two-sentence inputs; each request is {args.frames} frames = {args.frames / 12.5:.2f} s of 24 kHz audio (random
weights never emit EOS); sampling temperature 0.9, top-k 50; codec chunks of 2 frames, then 8. Client-side times;
one warm-up request per level, best of {args.repeats} runs per level (by audio per wall second). Server CPU = user +
system seconds of the server process during the run. Peak server RSS {rss.peak_mib:.0f} MiB. The machine is
shared with other work: wall times are noisy.

| concurrency | requests | TTFP p50 (s) | TTFP p95 (s) | latency p50 (s) | RTF mean | audio s / wall s | {_VS} |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{rows}

- Throughput at concurrency 8 vs 1: **{scale:.2f}x** (goal >= 4x): {_verdict(scale >= 4)}.
- TTFP / full latency at concurrency 1 (p50): **{ttfp_share:.2f}** (goal <= 0.25): {_verdict(ttfp_share <= 0.25)}.
- Streamed vs one-shot decode (greedy, {args.frames} frames, chunks 2 + 8 with carried Mimi state, vs transformers'
  `codec_model.decode` of the same codes): max |difference| {diff['max_abs']:.2e} on a peak of {diff['peak']:.1f}
  (random Mimi output is not clipped), SNR {diff['snr_db']:.0f} dB over {diff['samples']} samples.
"""
    print(body)
    if not args.no_write:
        write_section("TTS", "benchmarks/bench_tts.py", body)


if __name__ == "__main__":
    main()
