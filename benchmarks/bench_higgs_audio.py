"""TTS serving: Higgs-Audio v2 behind `omnistage serve`, against transformers' `generate` on the same text.

The same serving measurement as bench_tts.py (CSM), on the zoo's tiny Higgs-Audio v2 (DualFFN
talker emitting 4 codebooks per step in a delay pattern; codec = the audio tokenizer's DAC
decoder, streamed with a 12-frame lookahead; both at max_num_seqs 8, inline), greedy, the
talker held to `--rows` steps per request (rows - 4 frames at 25 frames/s, unless a request
ends its stream first). The baseline is transformers' own pipeline on the same prompts, in
this process with as many torch threads as the server: `HiggsAudioV2ForConditionalGeneration.generate`
(greedy) and the processor's `batch_decode`, one request at a time (concurrency 1) and all 8
in one padded batch (concurrency 8). transformers does not stream: its time to first audio is
its latency. Both sides make the same audio (tests/models/test_higgs_audio.py). Writes the
"TTS: Higgs-Audio v2" section of benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/bench_higgs_audio.py [--rows 64] [--requests 4 8 16] [--threads 1] [--repeats 3] [--no-write]
"""

from __future__ import annotations

import sys
import time


from bench_tts import PROMPTS, _VS, family_args, level_rows, load_average, one_at_a_time, per_cpu, serve_levels
from common import ROOT, write_section

FRAME_RATE = 25  # the audio tokenizer's frames per second (24 kHz / 960)


def transformers_baseline(path: str, rows: int, threads: int, repeats: int) -> dict:
    """transformers' generate + batch_decode on PROMPTS: per request alone, and all in one batch (best of `repeats`)."""
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from higgs_audio_reference import HiggsReference

    from omnistage.models.higgs_audio.prompt import parse_prompt

    torch.set_num_threads(threads)
    ref = HiggsReference(path)
    chats = [parse_prompt(p).conversation() for p in PROMPTS]
    alone = one_at_a_time(lambda i, text, r: len(ref.generate([chats[i]], rows)[1][0]) / 24000, repeats)
    batch = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        _, wavs = ref.generate(chats, rows)
        batch.append((time.perf_counter() - wall, time.process_time() - cpu, sum(len(w) for w in wavs) / 24000))
    batch_wall, batch_cpu, batch_audio = min(batch)
    return {**alone, "audio_per_s_1": alone["audio_per_s"], "audio_per_cpu_1": alone["audio_per_cpu"],
            "batch_s": batch_wall, "audio_per_s_8": batch_audio / batch_wall, "audio_per_cpu_8": batch_audio / batch_cpu}


def main() -> None:
    args = family_args(__doc__, "--rows", "talker steps per request (frames + 4)")
    sys.path.insert(0, str(ROOT))
    from omnistage.testing import ensure

    load_before = load_average()
    path = str(ensure("higgs-audio-v2", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    summaries, peak_mib = serve_levels(path, args.rows, args.threads, args.requests, args.repeats,
                                       sampling={"temperature": 0})
    base_hf = transformers_baseline(path, args.rows, args.threads, args.repeats)
    load_after = load_average()

    ours1, ours8 = summaries[0], summaries[-1]
    rows = level_rows(summaries, audio_digits=2, cpu_digits=1)
    body = f"""
Zoo higgs-audio-v2 (tiny), `omnistage serve` (talker and codec at max_num_seqs 8, inline, fp32, {args.threads} torch
thread(s)), loaded by `omnistage.bench` (`--task tts`: streamed `/v1/audio/speech`, `stream_format=audio`,
`response_format=pcm`). Two-sentence inputs, greedy, at most {args.rows} talker steps = {args.rows - 4} frames =
{(args.rows - 4) / FRAME_RATE:.2f} s of 24 kHz audio per request (some end their stream earlier); codec chunks of 2
frames, then 8, voiced 12 frames behind (the DAC decoder's receptive field). Client-side times; one warm-up request
per level, best of {args.repeats} runs per level (by audio per wall second). Peak server RSS {peak_mib:.0f} MiB.
Load average {load_before} before, {load_after} after (2 shared cores): wall times are noisy.

| concurrency | requests | TTFP p50 (s) | TTFP p95 (s) | latency p50 (s) | RTF mean | audio s / wall s | {_VS} |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{rows}

transformers 5.24 on the same 8 prompts, same process threads, greedy `generate` + `batch_decode` (best of
{args.repeats}): alone, latency p50 {base_hf['latency_p50_s']:.3f} s (= its time to first audio: it does not stream),
RTF mean {base_hf['rtf_mean']:.3f}, {base_hf['audio_per_s_1']:.2f} audio s / wall s, {base_hf['audio_per_cpu_1']:.1f} audio s / CPU s;
all 8 in one padded batch {base_hf['batch_s']:.3f} s, {base_hf['audio_per_s_8']:.2f} audio s / wall s,
{base_hf['audio_per_cpu_8']:.1f} audio s / CPU s.

- Time to first audio at concurrency 1 (p50): **{ours1['ttfp_p50_s']:.3f} s** vs transformers' whole request
  {base_hf['latency_p50_s']:.3f} s (**{base_hf['latency_p50_s'] / ours1['ttfp_p50_s']:.1f}x** sooner).
- RTF at concurrency 1: **{ours1['rtf_mean']:.3f}** vs {base_hf['rtf_mean']:.3f}; audio per wall second at concurrency 8:
  **{ours8['audio_seconds_per_s']:.2f}** (streamed over HTTP, requests arriving over time) vs {base_hf['audio_per_s_8']:.2f}
  (one batch of 8 in process, **{ours8['audio_seconds_per_s'] / base_hf['audio_per_s_8']:.2f}x**).
- Audio per CPU second (what a loaded machine does not blur): server at concurrency 1
  **{per_cpu(ours1):.1f}** vs transformers alone {base_hf['audio_per_cpu_1']:.1f}; at concurrency 8
  **{per_cpu(ours8):.1f}** vs transformers' batch of 8 {base_hf['audio_per_cpu_8']:.1f}.
"""
    print(body)
    if not args.no_write:
        write_section("TTS: Higgs-Audio v2", "benchmarks/bench_higgs_audio.py", body)


if __name__ == "__main__":
    main()
