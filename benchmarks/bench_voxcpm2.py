"""TTS serving: VoxCPM2 behind `omnistage serve`, against the authors' own `generate` on the same text.

The same serving measurement as bench_tts.py (CSM), on the zoo's tiny VoxCPM2 (base + residual
MiniCPM-4 LMs and a local DiT making one latent patch per step with 10 Euler steps; the causal
audio VAE decoder streamed with left context only; both at max_num_seqs 8, inline), the talker
held to `--patches` patches per request (the stop head ends some earlier). The baseline is the
authors' `voxcpm` 2.0.3 model (tests/models/voxcpm2_reference.py) in this process with as many
torch threads as the server: `VoxCPM2Model._generate_with_prompt_cache` + its one-shot VAE
decode, one request at a time. It has no batch (its KV cache holds one utterance), so its
concurrency 8 is the same one-at-a-time loop; it does not stream either (its
`generate_streaming` yields one patch at a time, unbatched). The tiny VAE makes 1 ms of audio
per patch (the released one 40 ms), so audio seconds are small: compare ratios. Writes the
"TTS: VoxCPM2" section of benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/bench_voxcpm2.py [--patches 64] [--requests 4 8 16] [--threads 1] [--repeats 3] [--no-write]
"""

from __future__ import annotations

import sys

from bench_tts import (
    _VS, family_args, level_rows, load_average, one_at_a_time, serve_levels, versus_authors)
from common import ROOT, write_section


def authors_baseline(path: str, patches: int, threads: int, repeats: int) -> dict:
    """The authors' generate + decode on PROMPTS, one at a time (best of `repeats` per prompt)."""
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from voxcpm2_reference import reference_model

    torch.set_num_threads(threads)
    ref = reference_model(ROOT / ".omnistage-cache", path)

    def speak(i: int, text: str, r: int) -> float:
        gen = ref._generate_with_prompt_cache(target_text=text, prompt_cache=None, max_len=patches)
        wav, _, _ = next(gen)
        gen.close()
        return wav.shape[-1] / ref.sample_rate

    return one_at_a_time(speak, repeats)


def main() -> None:
    args = family_args(__doc__, "--patches", "talker steps (latent patches) per request at most")
    sys.path.insert(0, str(ROOT))
    from omnistage.testing import ensure

    load_before = load_average()
    path = str(ensure("voxcpm2", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    summaries, peak_mib = serve_levels(path, args.patches, args.threads, args.requests, args.repeats)
    base = authors_baseline(path, args.patches, args.threads, args.repeats)
    load_after = load_average()

    ours1, ours8 = summaries[0], summaries[-1]
    rows = level_rows(summaries)
    body = f"""
Zoo voxcpm2 (tiny), `omnistage serve` (talker and VAE at max_num_seqs 8, inline, fp32, {args.threads} torch
thread(s)), loaded by `omnistage.bench` (`--task tts`: streamed `/v1/audio/speech`, `stream_format=audio`,
`response_format=pcm`). Two-sentence inputs, unseeded, at most {args.patches} patches per request (the stop head ends
some earlier); the tiny VAE voices 1 ms of 48 kHz audio per patch, so audio seconds are small and only ratios
matter. VAE chunks of 5 patches, then 25. Client-side times; one warm-up request per level, best of {args.repeats}
runs per level (by audio per wall second). Peak server RSS {peak_mib:.0f} MiB.
Load average {load_before} before, {load_after} after (2 shared cores, other jobs running): wall times are noisy.

| concurrency | requests | TTFP p50 (s) | TTFP p95 (s) | latency p50 (s) | RTF mean | audio s / wall s | {_VS} |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{rows}

The authors' `voxcpm` 2.0.3 on the same 8 prompts, same process threads, `_generate_with_prompt_cache` + one-shot
VAE decode, one at a time (it has no batch; best of {args.repeats}): latency p50 {base['latency_p50_s']:.3f} s
(= its time to first audio), RTF mean {base['rtf_mean']:.3f}, {base['audio_per_s']:.3f} audio s / wall s,
{base['audio_per_cpu']:.3f} audio s / CPU s.

{versus_authors(ours1, ours8, base)}
"""
    print(body)
    if not args.no_write:
        write_section("TTS: VoxCPM2", "benchmarks/bench_voxcpm2.py", body)


if __name__ == "__main__":
    main()
