"""Omni prefix cache: time to first audio on a repeated system prompt, prefix-cache hit vs uncached.

Requests with audio out through `AsyncOmni` (the user's path) on the zoo's tiny qwen2.5-omni and
qwen3-omni, fp32, CPU, inline stages: a long system prompt (`--system-words` words: by default about
1.2k and 3.8k tokens) and one short question each, a greedy 8-token answer, the talker held to its default first chunk's frames plus
a few. Two engines in the same process:

- cached: the default deploy (`enable_prefix_caching: true`), warmed with one request so the
  system prompt's blocks (with the hidden states the talker reads) are in the thinker's cache,
  and the talker's blocks over the same rows in the talker's; each timed request asks a new
  question after the same system prompt (a hit on the system prompt), and then the same request
  again (a hit up to its last block);
- uncached: the same with `enable_prefix_caching: false` on the thinker and the talker (stages 0, 1).

Each question runs on both, interleaved; text and waveform must be equal. The statistic is the
median time to the first audio chunk (TTFA) over `--repeats` questions, and to the first text
(the thinker's first token: the part the cache shortens). Goal: cached TTFA <= 0.5x uncached. Prints a markdown table and writes it under "## Omni prefix cache" in
benchmarks/RESULTS.md, with the load average.

    .venv/bin/python benchmarks/bench_omni_prefix_cache.py [--repeats 5] [--system-words 400 1300] [--clock cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import numpy as np
import torch
from common import ROOT, write_section

NEW_TOKENS = 8
CLOCK = [time.perf_counter]
"""Wall clock by default; `--clock cpu` times by process CPU time instead (every stage runs inline on
one torch thread, so on a shared machine it is what the run takes on an idle core)."""
FAMILIES = ("qwen2.5-omni", "qwen3-omni")
NOTE = ("Both caches shorten the prefills: the thinker's over the system prompt, and the talker's over the "
        "same rows (Qwen2.5-Omni; Qwen3-Omni's talker reads no system turn, so only the same request again hits "
        "it). What is left of the time to first audio is the talker's first chunk's frames and the vocoder's "
        "first chunk, which no cache shortens.")
"""What the numbers mean (written under the table; edit it when a rerun changes the picture)."""
QUESTIONS = ["Who are you?", "Tell me a story.", "What is a robot?", "Why is the sky blue?", "Name a color.",
             "Count to three.", "Say hello.", "What is music?", "Describe a cat.", "What time is it?"]


def params(family: str) -> dict:
    from omnistage import SamplingParams

    thinker = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    if family == "qwen2.5-omni":
        from omnistage.models.qwen2_5_omni import Token2WavParams

        # 36 frames: the default first chunk (12) and its look-ahead (12), then some
        return {"thinker": thinker, "talker": SamplingParams(temperature=0, max_tokens=36, min_tokens=36,
                                                             repetition_penalty=1.0),
                "token2wav": Token2WavParams(seed=0, num_steps=10)}
    from omnistage.models.qwen3_omni import Code2WavParams

    return {"thinker": thinker, "talker": SamplingParams(temperature=0, max_tokens=10, min_tokens=10,
                                                         repetition_penalty=1.0),
            "code2wav": Code2WavParams()}


async def first_audio(engine, messages, family: str) -> tuple[float, float, object]:
    """(time to the first text, time to the first audio chunk, the finished output)."""
    start = CLOCK[0]()
    ttft = ttfa = last = None
    async for out in engine.generate({"messages": messages}, params(family)):
        if ttft is None and out.text_delta:
            ttft = CLOCK[0]() - start
        if ttfa is None and out.audio_chunk is not None and len(out.audio_chunk):
            ttfa = CLOCK[0]() - start
        last = out
    assert last.error is None, last.error
    return ttft, ttfa, last


def bench(family: str, repeats: int, system_words: int) -> dict:
    from omnistage import AsyncOmni
    from omnistage.testing import ensure

    path = str(ensure(family, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    words = "You are a helpful assistant who answers briefly and kindly, in plain words.".split()
    system = {"role": "system", "content": " ".join(words[i % len(words)] for i in range(system_words))}
    cached = AsyncOmni(path)
    off = {"enable_prefix_caching": False}
    uncached = AsyncOmni(path, stage_overrides={"0": off, "1": off})
    loop = asyncio.new_event_loop()
    times = {"uncached": [], "cached": [], "repeat": [], "ttft_uncached": [], "ttft_cached": []}
    prompt_tokens = cached_tokens = repeat_tokens = 0
    talker_tokens = talker_cached = talker_repeat = 0
    try:
        with torch.inference_mode():
            for engine in (cached, uncached):  # warm-up; the cached engine's run caches the system prompt
                loop.run_until_complete(first_audio(engine, [system, {"role": "user", "content": "Hi."}], family))
            for i in range(repeats):
                messages = [system, {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] + f" ({i})"}]
                ttft_base, base, ref = loop.run_until_complete(first_audio(uncached, messages, family))
                ttft_hit, hit, out = loop.run_until_complete(first_audio(cached, messages, family))
                _, again, out2 = loop.run_until_complete(first_audio(cached, messages, family))
                for o in (out, out2):  # parity with the uncached run
                    assert o.token_ids == ref.token_ids and np.array_equal(o.audio, ref.audio), family
                thinker = lambda o: o.metrics["stages"]["thinker"]  # noqa: E731
                talker = lambda o: o.metrics["stages"]["talker"]  # noqa: E731
                times["uncached"].append(base)
                times["cached"].append(hit)
                times["repeat"].append(again)
                times["ttft_uncached"].append(ttft_base)
                times["ttft_cached"].append(ttft_hit)
                prompt_tokens = thinker(out)["num_prompt_tokens"]
                cached_tokens, repeat_tokens = thinker(out)["num_cached_tokens"], thinker(out2)["num_cached_tokens"]
                talker_tokens = talker(out)["num_prompt_tokens"]
                talker_cached, talker_repeat = talker(out)["num_cached_tokens"], talker(out2)["num_cached_tokens"]
                assert thinker(ref)["num_cached_tokens"] == 0 and talker(ref)["num_cached_tokens"] == 0
    finally:
        cached.close()
        uncached.close()
        loop.close()
    median = {name: statistics.median(t) for name, t in times.items()}
    return {"median": median, "prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens,
            "repeat_tokens": repeat_tokens, "talker": (talker_tokens, talker_cached, talker_repeat)}


def table(results: dict, repeats: int) -> str:
    load = os.getloadavg()
    lines = [
        f"Requests with audio out through `AsyncOmni`, zoo tiny checkpoints, fp32, CPU, inline stages, "
        f"{torch.get_num_threads()} torch thread(s); greedy {NEW_TOKENS}-token answers after one long system "
        f"prompt (two lengths); median time to first audio (TTFA) of {repeats} questions, each on both engines, interleaved; "
        f"text and waveform equal to the uncached run's. Load average at the end: "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}.",
        "",
        "| family | prompt tokens | thinker tokens from the cache (new question / same again) | talker prompt: "
        "tokens, from the cache (new / again) | time to first "
        "text (TTFT) uncached -> hit | ratio | TTFA uncached | TTFA new question, hit | ratio | TTFA same request again | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (family, _), r in results.items():
        m = r["median"]
        talker_tokens, talker_cached, talker_repeat = r["talker"]
        lines.append(f"| {family} | {r['prompt_tokens']} | {r['cached_tokens']} / {r['repeat_tokens']} | "
                     f"{talker_tokens}: {talker_cached} / {talker_repeat} | "
                     f"{m['ttft_uncached'] * 1e3:.0f} -> {m['ttft_cached'] * 1e3:.0f} ms | "
                     f"{m['ttft_cached'] / m['ttft_uncached']:.2f}x | "
                     f"{m['uncached'] * 1e3:.0f} ms | {m['cached'] * 1e3:.0f} ms | "
                     f"{m['cached'] / m['uncached']:.2f}x | {m['repeat'] * 1e3:.0f} ms | "
                     f"{m['repeat'] / m['uncached']:.2f}x |")
    verdicts = [f"{family} at {r['prompt_tokens']} tokens {r['median']['cached'] / r['median']['uncached']:.2f}x "
                f"({'met' if r['median']['cached'] <= 0.5 * r['median']['uncached'] else 'missed'})"
                for (family, _), r in results.items()]
    lines += ["", f"**Goal: TTFA with a hit <= 0.5x uncached; in this run: {'; '.join(verdicts)}.** " + NOTE]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--system-words", type=int, nargs="+", default=[400, 1300])
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall clock, or process CPU time (for a shared, loaded machine)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    CLOCK[0] = time.perf_counter if args.clock == "wall" else time.process_time
    torch.set_num_threads(1)
    results = {(family, words): bench(family, args.repeats, words)
               for family in args.families for words in args.system_words}
    body = table(results, args.repeats) + "\n\n" + (
        "Times are process CPU time (`--clock cpu`: a shared, loaded machine; every stage inline on one thread; "
        "it also counts the orchestrator's loop thread)." if args.clock == "cpu" else "Times are wall clock.")
    print(body)
    if not args.no_write:
        write_section("Omni prefix cache: talker prefix cache", "benchmarks/bench_omni_prefix_cache.py", body)


if __name__ == "__main__":
    main()
