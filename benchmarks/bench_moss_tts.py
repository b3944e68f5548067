"""TTS serving: MOSS-TTS behind `omnistage serve`, against the authors' own `generate` on the same text.

The same serving measurement as bench_tts.py (CSM), on the zoo's tiny MOSS-TTS (a Qwen3 backbone
over text + 32 codebooks in a delay pattern, the authors' sampling; MOSS-Audio-Tokenizer's causal
transformer decoder streamed; both at max_num_seqs 8, inline), the talker held to `--steps` steps
per request (the text head ends most earlier). The baseline is the authors' `moss-tts-lite` 1.1.0
(tests/models/moss_tts_reference.py) in this process with as many torch threads as the server:
their eager `generate` (the CPU path: their fast path needs CUDA) + their codec decode of each
audio block, one request at a time. It has no batch (its KV cache holds one utterance), so its
concurrency 8 is the same one-at-a-time loop, and it does not stream. The tiny codec voices
80 ms of audio per frame, as the released one. Writes the "TTS: MOSS-TTS" section of
benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/bench_moss_tts.py [--steps 64] [--requests 4 8 16] [--threads 1] [--repeats 3] [--no-write]
"""

from __future__ import annotations

import sys

from bench_tts import (
    _VS, family_args, level_rows, load_average, one_at_a_time, serve_levels, versus_authors)
from common import ROOT, write_section


def authors_baseline(path: str, steps: int, threads: int, repeats: int) -> dict:
    """The authors' generate + decode on PROMPTS, one at a time (best of `repeats` per prompt)."""
    import torch
    from safetensors.torch import load_file

    sys.path.insert(0, str(ROOT / "tests" / "models"))
    from moss_tts_reference import module

    torch.set_num_threads(threads)
    cache = ROOT / ".omnistage-cache"
    generate, prompt, codec, model, bpe = (module(cache, m) for m in ("generate", "prompt", "codec", "model", "bpe"))
    ref = model.MossTTSModel(load_file(f"{path}/model.safetensors"), device="cpu", dtype=torch.float32,
                             max_seq_len=1024)
    tok = bpe.QwenBPE(f"{path}/vocab.json", f"{path}/merges.txt", f"{path}/tokenizer.json")
    decoder = codec.MossCodecDecoder(f"{path}/MOSS-Audio-Tokenizer", device="cpu")

    def speak(i: int, text: str, r: int) -> float:
        res = generate.generate(ref, prompt.build_tts_prompt(text, tokenizer=tok), max_new_tokens=steps,
                                seed=100 * i + r)
        wavs = [decoder.decode(s) for s in codec.delayed_rows_to_segments(res.audio_frames)]
        return sum(w.shape[0] for w in wavs) / 24000

    return one_at_a_time(speak, repeats)


def main() -> None:
    args = family_args(__doc__, "--steps", "talker steps per request at most")
    sys.path.insert(0, str(ROOT))
    from omnistage.testing import ensure

    load_before = load_average()
    path = str(ensure("moss-tts", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    summaries, peak_mib = serve_levels(path, args.steps, args.threads, args.requests, args.repeats)
    base = authors_baseline(path, args.steps, args.threads, args.repeats)
    load_after = load_average()

    ours1, ours8 = summaries[0], summaries[-1]
    rows = level_rows(summaries)
    body = f"""
Zoo moss-tts (tiny), `omnistage serve` (talker and codec at max_num_seqs 8, inline, fp32, {args.threads} torch
thread(s)), loaded by `omnistage.bench` (`--task tts`: streamed `/v1/audio/speech`, `stream_format=audio`,
`response_format=pcm`). Two-sentence inputs, unseeded, at most {args.steps} talker steps per request (the text head
ends most earlier; the delay pattern spends 32 steps after the last frame's first code); the codec voices 80 ms
of 24 kHz audio per frame. Codec chunks of 5 frames, then 25. Client-side times; one warm-up request per level,
best of {args.repeats} runs per level (by audio per wall second). Peak server RSS {peak_mib:.0f} MiB.
Load average {load_before} before, {load_after} after (2 shared cores, other jobs running): wall times are noisy.

| concurrency | requests | TTFP p50 (s) | TTFP p95 (s) | latency p50 (s) | RTF mean | audio s / wall s | {_VS} |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{rows}

The authors' `moss-tts-lite` 1.1.0 on the same 8 prompts, same process threads, eager `generate` + their codec
decode, one at a time (it has no batch; best of {args.repeats}, seeded per run): latency p50
{base['latency_p50_s']:.3f} s (= its time to first audio), RTF mean {base['rtf_mean']:.3f},
{base['audio_per_s']:.3f} audio s / wall s, {base['audio_per_cpu']:.3f} audio s / CPU s.

{versus_authors(ours1, ours8, base)}
"""
    print(body)
    if not args.no_write:
        write_section("TTS: MOSS-TTS", "benchmarks/bench_moss_tts.py", body)


if __name__ == "__main__":
    main()
