"""Qwen3-Omni time to first audio vs full response time, in one script.

One request on the zoo's tiny qwen3-omni: a greedy 64-token answer (min_tokens =
max_tokens = 64), the talker held to `--frames` codec frames (min = max: random weights
stop at random), fp32, CPU.

- ours, streamed: `AsyncOmni` with the streamed thinker -> talker hand-off and the default
  chunking (a first chunk of 5 frames, then 25, each decoded with 25 frames of left
  context): time to the first audio chunk (TTFA) and to the finished output;
- ours, whole hand-off: the same, but the talker starts once the thinker has finished
  (`QWEN3_OMNI_WHOLE_HANDOFF`, what omnistage did before the streamed hand-off);
- ours, whole: `Code2WavParams(chunk_frames=0)`, one code2wav pass after the talker (the
  exact reference decode);
- transformers: `Qwen3OmniMoeForConditionalGeneration.generate` with the same settings (one
  talker token more: it voices one frame less than it samples when stopped by length); its
  first audio is its last.

Each is warmed up once, then timed `--repeats` times interleaved; the best run counts.
Prints a markdown table and writes it under "## Qwen3-Omni" in benchmarks/RESULTS.md
(other sections are kept). Goals: streamed TTFA / full response time <= 0.30, and TTFA
against the whole hand-off's <= 0.5x.

    .venv/bin/python benchmarks/bench_qwen3_omni.py [--frames 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch
from common import ROOT, PeakRSS, write_section

NEW_TOKENS = 64
SAMPLES_PER_FRAME, SAMPLE_RATE = 1920, 24000
MESSAGES = [{"role": "user", "content": "Tell me a long story about a little robot who loved to paint."}]


def ours_params(num_frames: int, whole: bool):
    from omnistage import SamplingParams
    from omnistage.models.qwen3_omni import Code2WavParams

    return {
        "thinker": SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS),
        "talker": SamplingParams(temperature=0, max_tokens=num_frames, min_tokens=num_frames, repetition_penalty=1.0),
        "code2wav": Code2WavParams(chunk_frames=0) if whole else Code2WavParams(),
    }


async def run_ours(engine, params) -> dict:
    start = time.perf_counter()
    first_audio = None
    last = None
    async for out in engine.generate({"messages": MESSAGES, "voice": "Ethan"}, params):
        if first_audio is None and out.audio_chunk is not None and len(out.audio_chunk):
            first_audio = time.perf_counter() - start
        last = out
    total = time.perf_counter() - start
    assert last.error is None, last.error
    return {"ttfa": first_audio, "total": total, "tokens": len(last.token_ids), "samples": len(last.audio)}


def run_reference(model, inputs, num_frames: int) -> dict:
    start = time.perf_counter()
    ids, wav = model.generate(
        **inputs, speaker="Ethan", thinker_max_new_tokens=NEW_TOKENS, thinker_min_new_tokens=NEW_TOKENS,
        thinker_do_sample=False, talker_max_new_tokens=num_frames + 1, talker_min_new_tokens=num_frames + 1,
        talker_do_sample=False, talker_repetition_penalty=1.0)
    total = time.perf_counter() - start
    return {"ttfa": total, "total": total, "tokens": ids.shape[1] - inputs["input_ids"].shape[1],
            "samples": wav.shape[-1]}


def bench(num_frames: int, repeats: int) -> dict:
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    from omnistage import AsyncOmni
    from omnistage.models.qwen3_omni import QWEN3_OMNI_WHOLE_HANDOFF
    from omnistage.testing import ensure

    path = str(ensure("qwen3-omni", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    inputs = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    engine = AsyncOmni(path)
    handoff_engine = AsyncOmni(path, pipeline=QWEN3_OMNI_WHOLE_HANDOFF)
    loop = asyncio.new_event_loop()
    runs = {
        "streamed": lambda: loop.run_until_complete(run_ours(engine, ours_params(num_frames, whole=False))),
        "whole_handoff": lambda: loop.run_until_complete(
            run_ours(handoff_engine, ours_params(num_frames, whole=False))),
        "whole": lambda: loop.run_until_complete(run_ours(engine, ours_params(num_frames, whole=True))),
        "transformers": lambda: run_reference(model, inputs, num_frames),
    }
    best: dict[str, dict] = {}
    try:
        with torch.inference_mode():
            for fn in runs.values():  # warm-up
                fn()
            for _ in range(repeats):
                for name, fn in runs.items():
                    r = fn()
                    if name not in best or r["total"] < best[name]["total"]:
                        best[name] = r
    finally:
        engine.close()
        handoff_engine.close()
        loop.close()
    lengths = {name: r["samples"] for name, r in best.items()}
    for name, r in best.items():
        assert r["tokens"] == NEW_TOKENS, (name, r)
    # Same frames, so the same length: code2wav's cut tail is made once at the end in every run.
    assert len(set(lengths.values())) == 1 and lengths["whole"] > (num_frames - 1) * SAMPLES_PER_FRAME, lengths
    return best


def table(best: dict, num_frames: int) -> str:
    s, h, w, t = best["streamed"], best["whole_handoff"], best["whole"], best["transformers"]
    audio_s = num_frames * SAMPLES_PER_FRAME / SAMPLE_RATE
    lines = [
        f"One request: greedy {NEW_TOKENS}-token answer, talker held to {num_frames} codec frames "
        f"({audio_s:.2f} s of 24 kHz audio, 4 codebooks per frame), zoo qwen3-omni tiny (MoE thinker and talker), "
        f"fp32, CPU, {torch.get_num_threads()} torch thread(s), inline stages, best of the timed runs. "
        "Streamed = the streamed thinker -> talker hand-off and the default chunking (5 frames, then 25, "
        "with 25 frames of left context); whole hand-off = the same chunking, the talker started after the "
        "thinker; whole utterance = one code2wav pass after the talker. "
        "Measured on a shared, loaded machine (about 8 engineers on 2 cores).",
        "",
        "| run | time to first audio | full response | TTFA / own full response — goal <= 0.30 "
        "| TTFA / transformers full response |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, r in (("omnistage, streamed", s), ("omnistage, whole hand-off", h), ("omnistage, whole utterance", w),
                    ("transformers `generate`", t)):
        lines.append(f"| {name} | {r['ttfa']:.3f} s | {r['total']:.3f} s | {r['ttfa'] / r['total']:.2f} "
                     f"| {r['ttfa'] / t['total']:.2f} |")
    lines += ["", f"Time to first audio, streamed hand-off / whole hand-off (goal <= 0.5x): {s['ttfa'] / h['ttfa']:.2f}x."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=64, help="codec frames the talker makes (12.5 per second)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: on a shared machine, OpenMP spin-waits dominate a tiny model)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with PeakRSS() as rss:
        best = bench(args.frames, args.repeats)
    rss_line = (f"Peak RSS of the process (omnistage's three stages and transformers' model loaded together): "
                f"{rss.peak_mib:.0f} MiB.")
    body = f"{table(best, args.frames)}\n\n{rss_line}"
    print(body)
    if not args.no_write:
        write_section("Qwen3-Omni", "benchmarks/bench_qwen3_omni.py", body)


if __name__ == "__main__":
    main()
