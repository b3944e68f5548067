"""TTS serving: Qwen3-TTS (CustomVoice) behind `omnistage serve`, loaded by the `omnistage bench serve` client.

The same measurement as bench_tts.py (CSM), on the zoo's tiny Qwen3-TTS CustomVoice
checkpoint (talker + code predictor, 4 codebooks; codec = the 12 Hz speech tokenizer's
decoder, both at max_num_seqs 8, inline), voice "vivian", the checkpoint's sampling
(temperature 0.9, top-k 50, repetition penalty 1.05), and the talker held to `--frames`
frames per request (the random weights never emit EOS). Codec chunks: 5 frames, then 25,
each decoded with 25 frames of left context (the defaults, as the authors' chunked decode).

Goals: audio per wall second at concurrency 8 >= 4x concurrency 1, and TTFP at
concurrency 1 <= 25% of the request's full latency. It also measures, in process, how far
the streamed waveform is from the one-shot decode of the same frames (which equals the
authors' decode: tests/models/test_qwen3_tts.py). Writes the "TTS: Qwen3-TTS" section of
benchmarks/RESULTS.md. The codec (Qwen3-Omni's `Code2Wav`) decodes together the streams whose
windows have the same length (left context + chunk), one pass per length.

    .venv/bin/python benchmarks/bench_qwen3_tts.py [--frames 64] [--requests 4 8 16] [--threads 1] [--repeats 3] [--no-write]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from bench_tts import PROMPTS, _VS, _verdict, load, start_server
from common import PeakRSS, ROOT, write_section

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=64, help="talker frames per request (12.5 per second of audio)")
    p.add_argument("--requests", type=int, nargs=3, default=[4, 8, 16], help="requests timed at concurrency 1, 4, 8")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server process")
    p.add_argument("--repeats", type=int, default=3, help="runs per concurrency level; the best counts")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from omnistage.testing import ensure

    path = str(ensure("qwen3-tts-custom-voice", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    proc, url = start_server(path, args.frames, args.threads)
    try:
        with PeakRSS(proc.pid) as rss:
            summaries = load(url, args.requests, args.repeats, proc.pid, voice=VOICE)
    finally:
        proc.terminate()
        proc.wait(60)
    diff = streamed_vs_whole(path, args.frames)

    base, top = summaries[0], summaries[-1]
    scale = top["audio_seconds_per_s"] / base["audio_seconds_per_s"]
    ttfp_share = base["ttfp_p50_s"] / base["latency_p50_s"]
    rows = "\n".join(
        f"| {s['max_concurrency']} | {s['completed']} | {s['ttfp_p50_s']:.3f} | {s['ttfp_p95_s']:.3f} | "
        f"{s['latency_p50_s']:.3f} | {s['rtf_mean']:.3f} | {s['audio_seconds_per_s']:.2f} | "
        f"{s['audio_seconds_per_s'] / base['audio_seconds_per_s']:.2f}x | "
        f"{s['completed'] * args.frames / 12.5 / s['server_cpu_s']:.1f} |" for s in summaries)
    body = f"""
Zoo qwen3-tts-custom-voice (tiny), `omnistage serve` (talker and codec at max_num_seqs 8, inline, fp32,
{args.threads} torch thread(s)), loaded by `omnistage.bench` (`--task tts`: streamed `/v1/audio/speech`,
`stream_format=audio`, `response_format=pcm`, voice "{VOICE}"). Two-sentence inputs; each request is {args.frames}
frames = {args.frames / 12.5:.2f} s of 24 kHz audio (random weights never emit EOS); sampling temperature 0.9,
top-k 50, repetition penalty 1.05; codec chunks of 5 frames, then 25, with 25 frames of left context. Client-side
times; one warm-up request per level, best of {args.repeats} runs per level (by audio per wall second). Server CPU =
user + system seconds of the server process during the run. Peak server RSS {rss.peak_mib:.0f} MiB. Taken on a
shared, loaded machine: wall times are noisy.

| concurrency | requests | TTFP p50 (s) | TTFP p95 (s) | latency p50 (s) | RTF mean | audio s / wall s | {_VS} |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{rows}

- Throughput at concurrency 8 vs 1: **{scale:.2f}x** (goal >= 4x): {_verdict(scale >= 4)}.
- TTFP / full latency at concurrency 1 (p50): **{ttfp_share:.2f}** (goal <= 0.25): {_verdict(ttfp_share <= 0.25)}.
- Streamed vs one-shot decode (greedy, {args.frames} frames, chunks 5 + 25 with 25 frames of left context, vs one
  pass over all frames, which equals the authors' decode): max |difference| {diff['max_abs']:.2e} on a peak of
  {diff['peak']:.3f}, SNR {diff['snr_db']:.0f} dB over {diff['samples']} samples.
"""
    print(body)
    if not args.no_write:
        write_section("TTS: Qwen3-TTS", "benchmarks/bench_qwen3_tts.py", body)


if __name__ == "__main__":
    main()
