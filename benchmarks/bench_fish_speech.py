"""TTS serving: Fish Speech behind `omnistage serve`, against the authors' own `generate` on the same text.

The same serving measurement as bench_tts.py (CSM), on the zoo's tiny Fish Speech (OpenAudio S1's dual-AR
talker: a slow transformer writing a semantic token per frame, a fast one the frame's 4 codebooks; the
authors' modded DAC decoder streamed; both at max_num_seqs 8, inline), the authors' sampling (temperature
0.8, top-p 0.8, repetition penalty 1.1), the talker held to `--frames` frames per request (`<|im_end|>` ends
some earlier). The baseline is the authors' `fish-speech` 0.1.0 (tests/models/fish_speech_reference.py)
in this process with as many torch threads as the server: their eager `generate` with the same sampling +
their codec decode (`decoder(quantizer.decode(codes))`, as `DAC.decode`), one request at a time. It has
no batch (its decode loop views every step as a batch of one; their server queue runs one request at a
time), so its concurrency 8 is the same one-at-a-time loop, and it does not stream. The codec voices
2048 samples of 44.1 kHz audio per frame (46 ms), as the released one. Writes the "TTS: Fish Speech"
section of benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/bench_fish_speech.py [--frames 64] [--requests 4 8 16] [--threads 1] [--repeats 3] [--no-write]
"""

from __future__ import annotations

import os
import sys

# The authors' decode loop draws a tqdm bar per request; tqdm reads this when it is imported.
os.environ.setdefault("TQDM_DISABLE", "1")

from bench_tts import (  # noqa: E402
    _VS, _verdict, family_args, level_rows, load_average, one_at_a_time, per_cpu, serve_levels,
    versus_authors)
from common import ROOT, write_section  # noqa: E402

SAMPLE_RATE, HOP = 44100, 2048


def authors_baseline(path: str, frames: int, threads: int, repeats: int) -> dict:
    """The authors' generate + decode on PROMPTS, one at a time (best of `repeats` per prompt)."""
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from fish_speech_reference import authors_codec, authors_prompt, module

    from omnistage.models.fish_speech import TALKER_SAMPLING

    torch.set_num_threads(threads)
    cache = ROOT / ".omnistage-cache"
    llama, inference = module(cache, "llama"), module(cache, "inference")
    model = llama.DualARTransformer.from_pretrained(path, load_weights=True).eval()
    codec, _ = authors_codec(cache, path)
    im_end = model.tokenizer.get_token_id("<|im_end|>")
    # The server's default sampling (the authors' TTS request's), which the server's requests get too.
    sampling = {k: TALKER_SAMPLING[k] for k in ("temperature", "top_p", "repetition_penalty")}

    def speak(i: int, text: str, r: int) -> float:
        prompt, audio_masks, audio_parts = authors_prompt(cache, model, text)
        torch.manual_seed(100 * i + r)
        rows = inference.generate(model=model, prompt=prompt, max_new_tokens=frames, audio_masks=audio_masks,
                                  audio_parts=audio_parts, **sampling)[:, prompt.shape[1]:]
        codes = rows[1:, :rows.shape[1] - int(rows[0, -1] == im_end)].long()  # the <|im_end|> step is no frame
        with torch.inference_mode():
            wav = codec["decoder"](codec["quantizer"].decode(codes[None]))[0, 0]
        return wav.shape[-1] / SAMPLE_RATE

    return one_at_a_time(speak, repeats)


def main() -> None:
    args = family_args(__doc__, "--frames", "talker frames per request at most")
    sys.path.insert(0, str(ROOT))
    from omnistage.testing import ensure

    load_before = load_average()
    path = str(ensure("fish-speech", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    summaries, peak_mib = serve_levels(path, args.frames, args.threads, args.requests, args.repeats)
    base = authors_baseline(path, args.frames, args.threads, args.repeats)
    load_after = load_average()

    ours1, ours8 = summaries[0], summaries[-1]
    scale = ours8["audio_seconds_per_s"] / ours1["audio_seconds_per_s"]
    share = ours1["ttfp_p50_s"] / ours1["latency_p50_s"]
    rows = level_rows(summaries)
    body = f"""
Zoo fish-speech (tiny), `omnistage serve` (talker and codec at max_num_seqs 8, inline, fp32, {args.threads} torch
thread(s)), loaded by `omnistage.bench` (`--task tts`: streamed `/v1/audio/speech`, `stream_format=audio`,
`response_format=pcm`). Two-sentence inputs, unseeded, the authors' sampling (temperature 0.8, top-p 0.8,
repetition penalty 1.1), at most {args.frames} frames per request = {args.frames * HOP / SAMPLE_RATE:.2f} s of 44.1 kHz
audio (`<|im_end|>` ends some earlier). Codec chunks of 5 frames, then 25. Client-side times; one warm-up request
per level, best of {args.repeats} runs per level (by audio per wall second). Peak server RSS {peak_mib:.0f} MiB.
Load average {load_before} before, {load_after} after (2 shared cores, other jobs running): wall times are noisy.

| concurrency | requests | TTFP p50 (s) | TTFP p95 (s) | latency p50 (s) | RTF mean | audio s / wall s | {_VS} |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{rows}

The authors' `fish-speech` 0.1.0 on the same 8 prompts, same process threads, eager `generate` (same sampling) +
their codec decode, one at a time (it has no batch; best of {args.repeats}, seeded per run): latency p50
{base['latency_p50_s']:.3f} s (= its time to first audio), RTF mean {base['rtf_mean']:.3f},
{base['audio_per_s']:.3f} audio s / wall s, {base['audio_per_cpu']:.3f} audio s / CPU s.

{versus_authors(ours1, ours8, base)}
- Goal (issue 33): throughput at concurrency 8 >= 3x concurrency 1 (audio per wall second): **{scale:.2f}x**,
  {_verdict(scale >= 3)} (per server CPU second, which the load blurs less: {per_cpu(ours8) / per_cpu(ours1):.2f}x);
  time to first audio <= 25% of the request at concurrency 1 (p50): **{share:.2f}**, {_verdict(share <= 0.25)}.
"""
    print(body)
    if not args.no_write:
        write_section("TTS: Fish Speech", "benchmarks/bench_fish_speech.py", body)


if __name__ == "__main__":
    main()
