"""TTS serving: Qwen3-TTS (CustomVoice) behind `omnistage serve`, loaded by the `omnistage bench serve` client.

The same measurement as bench_tts.py (CSM), on the zoo's tiny Qwen3-TTS CustomVoice
checkpoint (talker + code predictor, 4 codebooks; codec = the 12 Hz speech tokenizer's
decoder, both at max_num_seqs 8, inline), voice "vivian", the checkpoint's sampling
(temperature 0.9, top-k 50, repetition penalty 1.05), and the talker held to `--frames`
frames per request (the random weights never emit EOS). Codec chunks: 5 frames, then 25,
each decoded with the stream's carried state (the defaults).

Goals: audio per wall second at concurrency 8 >= 4x concurrency 1, and TTFP at
concurrency 1 <= 25% of the request's full latency. It also measures, in process, how far
the streamed waveform is from the one-shot decode of the same frames (which equals the
authors' decode: tests/models/test_qwen3_tts.py). Writes the "TTS: Qwen3-TTS" section of
benchmarks/RESULTS.md.

`--before REV` first serves the same load from a checkout of git revision REV (a temporary
worktree), so the table has a before and an after measured by the same script on the same machine.

    .venv/bin/python benchmarks/bench_qwen3_tts.py [--frames 64] [--requests 4 8 16] [--threads 1] [--repeats 3]
                                                   [--before REV] [--no-write]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from bench_tts import PROMPTS, _VS, _verdict, load, start_server
from common import PeakRSS, ROOT, checkout, write_section

VOICE = "vivian"


def streamed_vs_whole(path: str, frames: int) -> dict:
    from omnistage import Omni
    from omnistage.ar import SamplingParams
    from omnistage.models.qwen3_tts import Code2WavParams

    greedy = SamplingParams(temperature=0, max_tokens=frames, min_tokens=2)
    prompt = {"prompt": PROMPTS[0], "voice": VOICE}
    with Omni(path) as omni:
        whole = omni.generate(prompt, {"talker": greedy, "codec": Code2WavParams(chunk_frames=0)}, use_tqdm=False)[0]
        streamed = omni.generate(prompt, {"talker": greedy}, use_tqdm=False)[0]
    err = streamed.audio - whole.audio
    return {"max_abs": float(np.abs(err).max()), "peak": float(np.abs(whole.audio).max()),
            "snr_db": float(10 * np.log10((whole.audio ** 2).sum() / max((err ** 2).sum(), 1e-30))),
            "samples": len(whole.audio)}


def serve_and_load(path: str, args, source: str | None = None) -> tuple[list[dict], float]:
    proc, url = start_server(path, args.frames, args.threads, source=source)
    try:
        with PeakRSS(proc.pid) as rss:
            summaries = load(url, args.requests, args.repeats, proc.pid, voice=VOICE)
    finally:
        proc.terminate()
        proc.wait(60)
    return summaries, rss.peak_mib


def _loadavg() -> str:
    return open("/proc/loadavg").read().split()[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=64, help="talker frames per request (12.5 per second of audio)")
    p.add_argument("--requests", type=int, nargs=3, default=[4, 8, 16], help="requests timed at concurrency 1, 4, 8")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server process")
    p.add_argument("--repeats", type=int, default=3, help="runs per concurrency level; the best counts")
    p.add_argument("--before", metavar="REV", help="also serve the load from git revision REV first (before/after)")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from omnistage.testing import ensure

    path = str(ensure("qwen3-tts-custom-voice", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    runs = []  # (label, summaries, peak RSS MiB, load average after)
    if args.before:
        with checkout(args.before) as source:
            summaries, peak = serve_and_load(path, args, source)
        runs.append((f"before ({args.before})", summaries, peak, _loadavg()))
    summaries, peak = serve_and_load(path, args)
    runs.append(("after" if args.before else "this revision", summaries, peak, _loadavg()))
    diff = streamed_vs_whole(path, args.frames)

    rows, verdicts = [], []
    for label, summaries, peak, loadavg in runs:
        base, top = summaries[0], summaries[-1]
        scale = top["audio_seconds_per_s"] / base["audio_seconds_per_s"]
        ttfp_share = base["ttfp_p50_s"] / base["latency_p50_s"]
        rows += [
            f"| {label} | {s['max_concurrency']} | {s['completed']} | {s['ttfp_p50_s']:.3f} | {s['ttfp_p95_s']:.3f} | "
            f"{s['latency_p50_s']:.3f} | {s['rtf_mean']:.3f} | {s['audio_seconds_per_s']:.2f} | "
            f"{s['audio_seconds_per_s'] / base['audio_seconds_per_s']:.2f}x | "
            f"{s['completed'] * args.frames / 12.5 / s['server_cpu_s']:.1f} | {peak:.0f} | {loadavg} |"
            for s in summaries]
        # The server is one busy thread at every level: audio per server CPU second is what its throughput
        # would be with a core to itself, which wall time on a shared machine is not.
        cpu_scale = (top["completed"] / top["server_cpu_s"]) / (base["completed"] / base["server_cpu_s"])
        verdicts.append(f"- {label}: throughput at concurrency 8 vs 1 **{scale:.2f}x** by wall time (goal >= 4x): "
                        f"{_verdict(scale >= 4)}; by audio per server CPU second **{cpu_scale:.2f}x**; "
                        f"TTFP / full latency at concurrency 1 (p50) **{ttfp_share:.2f}** (goal <= 0.25): "
                        f"{_verdict(ttfp_share <= 0.25)}.")
    table = "\n".join(rows)
    verdict_lines = "\n".join(verdicts)
    body = f"""
Zoo qwen3-tts-custom-voice (tiny), `omnistage serve` (talker and codec at max_num_seqs 8, inline, fp32,
{args.threads} torch thread(s)), loaded by `omnistage.bench` (`--task tts`: streamed `/v1/audio/speech`,
`stream_format=audio`, `response_format=pcm`, voice "{VOICE}"). Two-sentence inputs; each request is {args.frames}
frames = {args.frames / 12.5:.2f} s of 24 kHz audio (random weights never emit EOS); sampling temperature 0.9,
top-k 50, repetition penalty 1.05; codec chunks of 5 frames, then 25. Before: each chunk decoded again with 25
frames of left context, one pass per stream; after: the codec carries each stream's state (a chunk costs its own
frames) and decodes the streams' chunks in one batched pass. Client-side times; one warm-up request per level,
best of {args.repeats} runs per level (by audio per wall second). Server CPU = user + system seconds of the server
process during the run. Load average (1 min) read after each server's runs: a shared, loaded machine, wall times
are noisy.

| run | concurrency | requests | TTFP p50 (s) | TTFP p95 (s) | latency p50 (s) | RTF mean | audio s / wall s | {_VS} | peak RSS (MiB) | load average |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
{table}

{verdict_lines}
- Streamed vs one-shot decode (greedy, {args.frames} frames, chunks 5 + 25, vs one pass over all frames, which
  equals the authors' decode): max |difference| {diff['max_abs']:.2e} on a peak of {diff['peak']:.3f},
  SNR {diff['snr_db']:.0f} dB over {diff['samples']} samples.
"""
    print(body)
    if not args.no_write:
        write_section("TTS: Qwen3-TTS", "benchmarks/bench_qwen3_tts.py", body)


if __name__ == "__main__":
    main()
