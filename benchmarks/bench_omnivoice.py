"""TTS serving: OmniVoice behind `omnistage serve`, against the authors' own `generate` on the same text.

The same serving measurement as bench_tts.py (CSM), on the zoo's tiny OmniVoice (a bidirectional Qwen3
unmasking 4 x 32 codes in `--steps` steps with CFG, in step mode: requests join between steps; the Higgs-Audio
v2 decoder streamed a second of frames at a time; both at max_num_seqs 8, inline). The baseline is the authors'
`omnivoice` 0.2.1 (tests/models/omnivoice_reference.py) in this process with as many torch threads as the
server, their `generate` with the same steps (their post-processing's silence removal off: it needs pydub),
one request at a time and, since it batches, all 8 prompts in one call. It does not stream. Writes the
"TTS: OmniVoice" section of benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/bench_omnivoice.py [--steps 64] [--requests 4 8 16] [--threads 1] [--repeats 3] [--no-write]
"""

from __future__ import annotations

import sys
import time

from bench_tts import PROMPTS, _VS, family_args, level_rows, load_average, one_at_a_time, per_cpu, serve_levels
from common import ROOT, write_section


def authors_baseline(path: str, steps: int, threads: int, repeats: int) -> tuple[dict, dict]:
    """The authors' `generate` on PROMPTS: one at a time (best of `repeats` per prompt), and all in
    one batched call (best of `repeats`): audio seconds per wall and CPU second."""
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from omnivoice_reference import reference_model

    torch.set_num_threads(threads)
    _, model = reference_model(ROOT / ".omnistage-cache", path)
    kwargs = {"num_step": steps, "postprocess_output": False}

    def speak(i: int, text: str, r: int) -> float:
        torch.manual_seed(100 * i + r)
        return model.generate(text, **kwargs)[0].shape[0] / model.sampling_rate

    alone = one_at_a_time(speak, repeats)
    runs = []
    for r in range(repeats):
        torch.manual_seed(r)
        wall, cpu = time.perf_counter(), time.process_time()
        audio = sum(a.shape[0] for a in model.generate(list(PROMPTS), **kwargs)) / model.sampling_rate
        runs.append((time.perf_counter() - wall, time.process_time() - cpu, audio))
    wall, cpu, audio = min(runs)
    return alone, {"audio_per_s": audio / wall, "audio_per_cpu": audio / cpu}


def main() -> None:
    args = family_args(__doc__, "--steps", "unmasking steps per request (the authors' default is 32)")
    sys.path.insert(0, str(ROOT))
    from omnistage.testing import ensure

    load_before = load_average()
    path = str(ensure("omnivoice", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    steps = {"0": {"default_sampling_params": {"num_inference_steps": args.steps}}}
    summaries, peak_mib = serve_levels(path, args.steps, args.threads, args.requests, args.repeats, stages=steps)
    base, batched = authors_baseline(path, args.steps, args.threads, args.repeats)
    load_after = load_average()

    ours1, ours8 = summaries[0], summaries[-1]
    rows = level_rows(summaries)
    body = f"""
Zoo omnivoice (tiny), `omnistage serve` (unmasking stage in step mode and codec at max_num_seqs 8, inline,
fp32, {args.threads} torch thread(s)), loaded by `omnistage.bench` (`--task tts`: streamed `/v1/audio/speech`,
`stream_format=audio`, `response_format=pcm`). Two-sentence inputs, unseeded, {args.steps} unmasking steps per
request; the length is the authors' estimate from the text (25 frames/s of 24 kHz audio); the codec streams 25
frames at a time. Client-side times; one warm-up request per level, best of {args.repeats} runs per level (by
audio per wall second). Peak server RSS {peak_mib:.0f} MiB. Load average {load_before} before, {load_after} after
(2 shared cores, other jobs running): wall times are noisy.

| concurrency | requests | TTFP p50 (s) | TTFP p95 (s) | latency p50 (s) | RTF mean | audio s / wall s | {_VS} |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{rows}

The authors' `omnivoice` 0.2.1 on the same 8 prompts, same process threads, `generate` with {args.steps} steps:
one at a time (best of {args.repeats}, seeded per run): latency p50 {base['latency_p50_s']:.3f} s (= its time to
first audio), RTF mean {base['rtf_mean']:.3f}, {base['audio_per_s']:.3f} audio s / wall s,
{base['audio_per_cpu']:.3f} audio s / CPU s; all 8 in one batched call: {batched['audio_per_s']:.3f} audio s /
wall s, {batched['audio_per_cpu']:.3f} audio s / CPU s.

- Time to first audio at concurrency 1 (p50): **{ours1['ttfp_p50_s']:.3f} s** vs the authors' whole request
  {base['latency_p50_s']:.3f} s (**{base['latency_p50_s'] / ours1['ttfp_p50_s']:.1f}x** sooner).
- Audio per wall second: concurrency 1 **{ours1['audio_seconds_per_s']:.3f}**
  (**{ours1['audio_seconds_per_s'] / base['audio_per_s']:.2f}x** the authors' one at a time), concurrency 8
  **{ours8['audio_seconds_per_s']:.3f}** (**{ours8['audio_seconds_per_s'] / batched['audio_per_s']:.2f}x** the
  authors' batch of 8).
- Audio per CPU second: server at concurrency 1 **{per_cpu(ours1):.3f}**, at concurrency 8
  **{per_cpu(ours8):.3f}**, vs the authors' {base['audio_per_cpu']:.3f} (one at a time) and
  {batched['audio_per_cpu']:.3f} (batched).
- Goal (the server's audio per wall second at concurrency 8 at least the authors' batch of 8):
  **{"met" if ours8['audio_seconds_per_s'] >= batched['audio_per_s'] else "NOT met"}**.
"""
    print(body)
    if not args.no_write:
        write_section("TTS: OmniVoice", "benchmarks/bench_omnivoice.py", body)


if __name__ == "__main__":
    main()
