"""Qwen2.5-Omni time to first audio vs full response time, in one script.

One request on the zoo's tiny qwen2.5-omni: a greedy 64-token answer (min_tokens =
max_tokens = 64), the talker held to `--codes` codec frames (min = max: random weights stop
at random), token2wav with the reference's 10 ODE steps, fp32, CPU.

- ours, streamed: `AsyncOmni` with the default chunking (a first chunk of 12 frames, one DiT
  block, then 36-frame chunks; 24 frames of left and 12 of right context): time to the first
  audio chunk (TTFA) and to the finished output;
- ours, streamed, first chunk with less look-ahead: `Token2WavParams(first_right_context=6)`
  (half a DiT block) and `first_right_context=0` (none: the vocoder misses its right halo);
- ours, streamed, first chunk of 36 frames (`first_chunk_size=0`, the previous default);
- ours, whole hand-off: the talker starts once the thinker has finished
  (`QWEN2_5_OMNI_WHOLE_HANDOFF`), with the previous default chunking (what omnistage did before
  the streamed hand-off) and with the default one;
- ours, whole: `Token2WavParams(chunk_size=0)`, one token2wav pass after the talker (the
  exact reference decode);
- transformers: `Qwen2_5OmniForConditionalGeneration.generate` with the same settings; its
  first audio is its last.

How far each streamed waveform is from the whole one (relative RMS error, same noise seed) is
the cost of its chunking. Token2wav's first window (24 frames) is also timed alone: our decoder's
DiT sampling (`DiTVelocity`: the window's, the ODE times' and the voice's terms once) against
transformers' `dit.sample`, and its BigVGAN pass over the first chunk's mel (12 frames + the
vocoder's halo: `BigVGANPass`, SnakeBeta's constants once) against the model's forward.

Each is warmed up once, then timed `--repeats` times interleaved; the best TTFA and the best
full response time count (each its own best run: the machine is shared).
Prints a markdown table and writes it under "## Qwen2.5-Omni" in benchmarks/RESULTS.md
(other sections are kept). Goals: streamed TTFA / full response time <= 0.08, and <= 0.5x the
whole hand-off's TTFA.

    .venv/bin/python benchmarks/bench_omni.py [--codes 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch
from common import ROOT, PeakRSS, write_section

NEW_TOKENS, NUM_STEPS = 64, 10
CLOCK = [time.perf_counter]
"""Wall clock by default; `--clock cpu` times by process CPU time instead (every stage runs inline
on one torch thread, so on a shared machine it is what the run takes on an idle core)."""
MESSAGES = [{"role": "user", "content": "Tell me a long story about a little robot who loved to paint."}]


def ours_params(num_codes: int, chunk_size: int, **chunking):
    from omnistage import SamplingParams
    from omnistage.models.qwen2_5_omni import Token2WavParams

    return {
        "thinker": SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS),
        "talker": SamplingParams(temperature=0, max_tokens=num_codes, min_tokens=num_codes, repetition_penalty=1.0),
        "token2wav": Token2WavParams(seed=0, num_steps=NUM_STEPS, chunk_size=chunk_size, **chunking),
    }


async def run_ours(engine, params) -> dict:
    start = CLOCK[0]()
    first_audio = None
    last = None
    async for out in engine.generate({"messages": MESSAGES}, params):
        if first_audio is None and out.audio_chunk is not None and len(out.audio_chunk):
            first_audio = CLOCK[0]() - start
        last = out
    total = CLOCK[0]() - start
    assert last.error is None, last.error
    return {"ttfa": first_audio, "total": total, "tokens": len(last.token_ids), "samples": len(last.audio),
            "audio": last.audio}


def run_reference(model, inputs, num_codes: int, talker_ids: tuple[int, int]) -> dict:
    start = CLOCK[0]()
    torch.manual_seed(0)
    ids, wav = model.generate(
        **inputs, speaker="Chelsie", thinker_max_new_tokens=NEW_TOKENS, thinker_min_new_tokens=NEW_TOKENS,
        thinker_do_sample=False, talker_max_new_tokens=num_codes, talker_min_new_tokens=num_codes,
        talker_do_sample=False, talker_repetition_penalty=1.0, talker_eos_token_id=list(talker_ids),
        token2wav_num_steps=NUM_STEPS)
    total = CLOCK[0]() - start
    return {"ttfa": total, "total": total, "tokens": ids.shape[1] - inputs["input_ids"].shape[1],
            "samples": wav.shape[0]}


def bench(num_codes: int, repeats: int) -> dict:
    from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration

    from omnistage import AsyncOmni
    from omnistage.models.qwen2_5_omni.params import DEFAULT_CHUNK_SIZE
    from omnistage.testing import ensure

    path = str(ensure("qwen2.5-omni", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    inputs = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    talker = model.config.talker_config
    talker_ids = (talker.tts_codec_pad_token_id, talker.tts_codec_end_token_id)
    from omnistage.models.qwen2_5_omni import QWEN2_5_OMNI_WHOLE_HANDOFF

    engine = AsyncOmni(path)
    handoff = AsyncOmni(path, pipeline=QWEN2_5_OMNI_WHOLE_HANDOFF)
    loop = asyncio.new_event_loop()
    streamed = ours_params(num_codes, DEFAULT_CHUNK_SIZE)
    half_look_ahead = ours_params(num_codes, DEFAULT_CHUNK_SIZE, first_right_context=6)
    no_look_ahead = ours_params(num_codes, DEFAULT_CHUNK_SIZE, first_right_context=0)
    before = ours_params(num_codes, DEFAULT_CHUNK_SIZE, first_chunk_size=0)
    runs = {
        "streamed": lambda: loop.run_until_complete(run_ours(engine, streamed)),
        "half_look_ahead": lambda: loop.run_until_complete(run_ours(engine, half_look_ahead)),
        "no_look_ahead": lambda: loop.run_until_complete(run_ours(engine, no_look_ahead)),
        "first36": lambda: loop.run_until_complete(run_ours(engine, before)),
        "handoff": lambda: loop.run_until_complete(run_ours(handoff, before)),
        "handoff_default": lambda: loop.run_until_complete(run_ours(handoff, streamed)),
        "whole": lambda: loop.run_until_complete(run_ours(engine, ours_params(num_codes, 0))),
        "transformers": lambda: run_reference(model, inputs, num_codes, talker_ids),
    }
    best: dict[str, dict] = {}
    try:
        with torch.inference_mode():
            for fn in runs.values():  # warm-up
                fn()
            for _ in range(repeats):
                for name, fn in runs.items():
                    r = fn()
                    if name not in best:
                        best[name] = r
                    # the best time to first audio and the best full response (a loaded machine)
                    best[name]["ttfa"] = min(best[name]["ttfa"], r["ttfa"])
                    best[name]["total"] = min(best[name]["total"], r["total"])
    finally:
        engine.close()
        handoff.close()
        loop.close()
    for name, r in best.items():
        assert r["tokens"] == NEW_TOKENS and r["samples"] == num_codes * 480, (name, r)
    best["dit"] = time_first_window(path, model, repeats)
    return best


def time_first_window(path: str, model, repeats: int) -> dict:
    """Best CPU/wall time of the DiT sampling of a first window (24 codes), ours against `dit.sample`,
    and of the first chunk's BigVGAN pass, ours against the model's forward."""
    from omnistage.models.qwen2_5_omni import Token2WavParams
    from omnistage.models.qwen2_5_omni.token2wav import Token2Wav

    ours = Token2Wav.load(path, None, torch.device("cpu"), torch.float32, 1)
    voice = ours.speakers["Chelsie"]
    codes = torch.randint(0, ours.num_codes, (1, 24), generator=torch.Generator().manual_seed(0))
    params = Token2WavParams(num_steps=NUM_STEPS)
    dit = model.token2wav.code2wav_dit_model

    def ours_fn():
        torch.manual_seed(0)
        return ours._sample(codes, torch.randn(1, 48, ours.dit.mel_dim), "Chelsie", params)

    def reference_fn():
        torch.manual_seed(0)
        return dit.sample(voice["cond"].float()[None], voice["ref_mel"].float(), codes, num_steps=NUM_STEPS)

    with torch.inference_mode():
        mel = ours_fn()[:, :, :24 + ours.vocoder_halo]  # the first chunk's 24 mel frames and the halo after them

    def ours_vocoder_fn():
        return ours.vocoder(mel)

    def reference_vocoder_fn():
        return model.token2wav.code2wav_bigvgan_model(mel)

    fns = {"ours": ours_fn, "reference": reference_fn, "ours_vocoder": ours_vocoder_fn,
           "reference_vocoder": reference_vocoder_fn}
    times = {name: [] for name in fns}
    with torch.inference_mode():
        assert torch.equal(ours_fn(), reference_fn())  # the same numbers
        assert torch.equal(ours_vocoder_fn(), reference_vocoder_fn())
        for _ in range(repeats + 1):
            for name, fn in fns.items():
                start = CLOCK[0]()
                fn()
                times[name].append(CLOCK[0]() - start)
    best = {name: min(t) for name, t in times.items()}
    best["vocoder_frames"] = mel.shape[2]
    ours.close()
    return best


def table(best: dict, num_codes: int) -> str:
    s, w, t = best["streamed"], best["whole"], best["transformers"]
    n, half, b = best["no_look_ahead"], best["half_look_ahead"], best["first36"]
    h, hd = best["handoff"], best["handoff_default"]
    audio_s = num_codes * 480 / 24000
    lines = [
        f"One request: greedy {NEW_TOKENS}-token answer, talker held to {num_codes} codec frames "
        f"({audio_s:.2f} s of 24 kHz audio), token2wav {NUM_STEPS} ODE steps, zoo qwen2.5-omni tiny, fp32, CPU, "
        f"{torch.get_num_threads()} torch thread(s), inline stages, best TTFA and best full response of the "
        "timed runs. "
        "Default chunking = a first chunk of 12 frames (one DiT block), then 36; 24 left + 12 right context.",
        "",
        "| run | time to first audio | full response | TTFA / own full response — goal <= 0.08 "
        "| TTFA / transformers full response |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, r in (("omnistage, streamed thinker -> talker, default chunking", s),
                    ("omnistage, streamed, first chunk with 6 frames of look-ahead (`first_right_context=6`)", half),
                    ("omnistage, streamed, first chunk without look-ahead (`first_right_context=0`)", n),
                    ("omnistage, streamed, first chunk 36 frames (previous default)", b),
                    ("omnistage, whole thinker -> talker hand-off, first chunk 36 frames (before)", h),
                    ("omnistage, whole thinker -> talker hand-off, default chunking", hd),
                    ("omnistage, whole utterance", w), ("transformers `generate`", t)):
        lines.append(f"| {name} | {r['ttfa']:.3f} s | {r['total']:.3f} s | {r['ttfa'] / r['total']:.2f} "
                     f"| {r['ttfa'] / t['total']:.2f} |")
    dit = best["dit"]
    lines += ["", f"Time to first audio against the whole thinker -> talker hand-off before (first chunk 36 frames) "
              f"in this run (goal <= 0.5x): streamed with the default chunking {s['ttfa'] / h['ttfa']:.2f}x, "
              f"with 6 frames of first look-ahead {half['ttfa'] / h['ttfa']:.2f}x, without first look-ahead "
              f"{n['ttfa'] / h['ttfa']:.2f}x, with the previous chunking "
              f"{b['ttfa'] / h['ttfa']:.2f}x; against the whole hand-off with the same default chunking "
              f"{s['ttfa'] / hd['ttfa']:.2f}x. Same codes: the streamed and whole hand-offs give the same waveform "
              f"(relative RMS difference {rel_error(s, hd):.1e}). Streamed against whole-utterance waveform (same "
              f"noise seed), relative RMS error over the utterance (over its first 12 frames): default chunking "
              f"{rel_error(s, w):.1e} ({rel_error(s, w, 12):.1e}), 6 frames of first look-ahead "
              f"{rel_error(half, w):.1e} ({rel_error(half, w, 12):.1e}), no first look-ahead {rel_error(n, w):.1e} "
              f"({rel_error(n, w, 12):.1e}), previous chunking {rel_error(b, w):.1e} ({rel_error(b, w, 12):.1e}): "
              "the cost of each chunking.",
              "", f"Token2wav's DiT sampling of a 24-frame first window alone: {dit['ours'] * 1e3:.1f} ms "
              f"(`DiTVelocity`: the window's, the ODE times' and the voice's terms once) against "
              f"{dit['reference'] * 1e3:.1f} ms (transformers `dit.sample`), {dit['reference'] / dit['ours']:.2f}x "
              f"faster, the same mel. Its BigVGAN pass over the first chunk ({dit['vocoder_frames']} mel frames: "
              f"24 voiced and the vocoder's halo): {dit['ours_vocoder'] * 1e3:.1f} ms (`BigVGANPass`: SnakeBeta's "
              f"constants once) against {dit['reference_vocoder'] * 1e3:.1f} ms (the model's forward), "
              f"{dit['reference_vocoder'] / dit['ours_vocoder']:.2f}x faster, the same waveform."]
    return "\n".join(lines)


def rel_error(a: dict, b: dict, frames: int | None = None) -> float:
    """Relative RMS difference of two waveforms, over their first `frames` codec frames (None: all)."""
    import numpy as np

    n = None if frames is None else frames * 480
    x, y = np.asarray(a["audio"][:n], dtype=np.float64), np.asarray(b["audio"][:n], dtype=np.float64)
    return float(np.sqrt(np.mean((x - y) ** 2)) / max(np.sqrt(np.mean(y ** 2)), 1e-12))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codes", type=int, default=256, help="codec frames the talker makes (50 per second)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: on a shared machine, OpenMP spin-waits dominate a tiny model)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall clock, or process CPU time (for a shared, loaded machine)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    CLOCK[0] = time.perf_counter if args.clock == "wall" else time.process_time
    with PeakRSS() as rss:
        best = bench(args.codes, args.repeats)
    rss_line = (f"Peak RSS of the process (omnistage's three stages and transformers' model loaded together): "
                f"{rss.peak_mib:.0f} MiB.")
    clock_line = ("Times are process CPU time (`--clock cpu`: a shared, loaded machine; every stage inline on one "
                  "thread; ours also counts the orchestrator's loop thread and the RSS sampler)." if args.clock == "cpu"
                  else "Times are wall clock.")
    body = f"{table(best, args.codes)}\n\n{clock_line} {rss_line}"
    print(body)
    if not args.no_write:
        write_section("Qwen2.5-Omni", "benchmarks/bench_omni.py", body)


if __name__ == "__main__":
    main()
