"""Voice under load: streamed speech from the tiny CSM, Qwen3-TTS and Qwen3-Omni at rising concurrency,
with the real-time admission on and off.

Server: `omnistage serve` on each zoo checkpoint (tiny, fp32, inline, 1 torch thread, every stage at
max_num_seqs 8), each request held to `--frames` codec frames (12.5 a second of 24 kHz audio); run
twice, with the final audio stage's `real_time_admission` on and off (the default). Both runs
schedule earliest deadline first (that is not a switch).

Client: `omnistage.bench` (`--task tts`: streamed POST /v1/audio/speech, pcm; Qwen3-Omni: `--task
chat`, streamed chat completions with a spoken answer), one wave of N requests at concurrency N
(all sent at once) per level, after one warm-up request per server. Each stream is played by a
real-time player from its first audio (`core/playback.py`); a stall of the player is an underrun.
Per level: TTFP p50 / p99, the p99 over streams of the time a stream's player stalled (goal: <= 100
ms at every level the server admits), the requests the server queued for the real-time budget
(/metrics `omnistage_audio_requests_queued_total`) or refused (429), audio made per wall second, and
audio made per second of the server process's CPU time (its threads' time on a CPU: what the server
would make with a core to itself, which a shared machine's wall time is not). `--repeats N` sends each level's
wave N times and keeps the wave with the most audio per server CPU second (best of N: other work on a
shared machine only adds time); `--before REV` first
serves the same waves from a checkout of git revision REV (a before and an after in one run).

Writes the "TTS under load" section of benchmarks/RESULTS.md. Keep it short: the levels of each model
stop at `--max-level` (Qwen3-Omni at 4: its tiny MoE makes audio at about real time on a loaded core).
TTFP is the time to the first audio (for Qwen3-Omni, not to its first text).

    .venv/bin/python benchmarks/bench_tts_load.py [--frames 24] [--max-level 8] [--repeats 1] [--before REV]
                                                  [--models ...] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

import httpx
import numpy as np

from bench_tts import PROMPTS, start_server
from common import ROOT, checkout, write_section

LEVELS = (1, 2, 4, 8, 16, 32)
MODELS = {  # zoo name -> (task, final audio stage, extra deploy fields by stage, request options, most level)
    "csm": ("tts", "1", {}, {"voice": "alloy"}, 32),
    "qwen3-tts-custom-voice": ("tts", "1", {}, {"voice": "vivian"}, 32),
    "qwen3-omni": ("chat", "2", None, {}, 4),
}
SAMPLING = {"temperature": 0.9, "top_k": 50}


def omni_stages(frames: int) -> dict:
    """Qwen3-Omni: a short greedy answer from the thinker, its talker held to `frames` frames."""
    return {"0": {"default_sampling_params": {"temperature": 0, "max_tokens": 8, "min_tokens": 8}},
            "1": {"default_sampling_params": {**SAMPLING, "max_tokens": frames, "min_tokens": frames}}}


def queued(url: str) -> float:
    found = re.search(r"^omnistage_audio_requests_queued_total\{[^}]*\} (\S+)$", httpx.get(url + "/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far, summed over its threads to the nanosecond (Linux schedstat; the
    10 ms ticks of `cpu_times()` are a sixth of a one-request wave's ~60 ms)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:  # the thread ended
            pass
    return total / 1e9


def run_model(name: str, admission: bool, frames: int, max_level: int, repeats: int = 1,
              source: str | None = None, build: str = "this revision") -> list[dict]:
    """`source`: a checkout of omnistage to serve from (`build` names it in the rows); default this one."""
    from omnistage.bench.report import summarize
    from omnistage.bench.runner import BenchConfig, run_benchmark
    from omnistage.bench.tasks import TaskOptions
    from omnistage.testing import ensure

    task, final, stages, options, most = MODELS[name]
    stages = dict(omni_stages(frames) if stages is None else stages)
    stages[final] = {**stages.get(final, {}), "real_time_admission": admission}
    path = str(ensure(name, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    proc, url = start_server(path, frames, 1, sampling=SAMPLING, stages=stages, source=source)
    opt = TaskOptions(max_tokens=8, extra_body={"modalities": ["text", "audio"], "audio": {"format": "pcm16"}}
                      if task == "chat" else {}, **options)
    rows = []
    try:  # one warm-up request first, outside every wave's times
        run_benchmark(BenchConfig(base_url=url, task=task, prompts=[{"prompt": PROMPTS[0]}], options=opt,
                                  max_concurrency=1, warmup=0, show_progress=False))
        for level in (lv for lv in LEVELS if lv <= min(most, max_level)):
            prompts = [{"prompt": PROMPTS[j % len(PROMPTS)]} for j in range(level)]
            waves = []
            for _ in range(repeats):
                before, cpu = queued(url), cpu_seconds(proc.pid)
                run = run_benchmark(BenchConfig(base_url=url, task=task, prompts=prompts, options=opt,
                                                max_concurrency=level, warmup=0, show_progress=False))
                cpu_s = cpu_seconds(proc.pid) - cpu
                s = summarize(run)
                ttfa = np.array([r.ttfa for r in run.results if r.ok and r.ttfa is not None])  # to the first audio
                refused = sum("429" in r.error or "requests queued or running" in r.error
                              for r in run.results if not r.ok)
                waves.append({"model": name, "build": build, "admission": admission, "level": level,
                              "completed": s["completed"], "errors": s["errors"] - refused, "refused": refused,
                              "queued": int(queued(url) - before), "ttfp_p50": float(np.percentile(ttfa, 50)),
                              "ttfp_p99": float(np.percentile(ttfa, 99)), "underrun_p99": s["underrun_p99_s"] or 0.0,
                              "streams_stalled": s["streams_with_underruns"] or 0,
                              "audio_per_s": s["audio_seconds_per_s"],
                              "audio_per_cpu_s": s["audio_seconds_per_s"] * s["duration_s"] / cpu_s,
                              "load": os.getloadavg()[0]})
                print(waves[-1], s["first_errors"][:1], flush=True)
            rows.append(max(waves, key=lambda r: r["audio_per_cpu_s"]))
    finally:
        proc.terminate()
        proc.wait(30)
    return rows


def table(rows: list[dict], frames: int, repeats: int, started: float) -> str:
    lines = [
        f"Zoo csm, qwen3-tts-custom-voice and qwen3-omni (tiny), `omnistage serve` (every stage at max_num_seqs 8, "
        f"inline, fp32, 1 torch thread), each request {frames} codec frames = {frames / 12.5:.2f} s of 24 kHz audio "
        "(sampling temperature 0.9, top-k 50; Qwen3-Omni: an 8-token greedy answer, then the talker). Client: "
        "`omnistage.bench`, streamed pcm (`--task tts`; Qwen3-Omni `--task chat` with a spoken answer), one wave of "
        "N requests sent at once at concurrency N, each stream played by a real-time player from its first audio. "
        "Underrun p99 = the p99 over streams of the time a stream's player stalled (goal <= 100 ms wherever "
        "the server admits the stream); queued = requests that waited for the real-time budget; refused = 429. "
        "Admission on = `real_time_admission: true`, off = every request starts at once; both schedule "
        "earliest deadline first. Audio s / CPU s = audio made per second of the server process's CPU time "
        f"(its threads' time on a CPU, Linux schedstat). "
        f"{'One wave' if repeats == 1 else f'The best wave of {repeats}'} per row (by audio per CPU second). "
        "Taken on the shared 2-core machine under load from other work (load average, 1 min, in the last "
        "column): wall times are noisy.",
        "",
        "| model | build | admission | concurrency | completed | queued | refused | TTFP p50 (s) | TTFP p99 (s) | "
        "underrun p99 (ms) | streams stalled | audio s / wall s | audio s / CPU s | load average |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['build']} | {'on' if r['admission'] else 'off'} | {r['level']} | "
                     f"{r['completed']} | {r['queued']} | {r['refused']} | {r['ttfp_p50']:.3f} | {r['ttfp_p99']:.3f} | "
                     f"{1000 * r['underrun_p99']:.0f} | {r['streams_stalled']} | {r['audio_per_s']:.2f} | "
                     f"{r['audio_per_cpu_s']:.2f} | {r['load']:.2f} |")
    lines += ["", f"Whole run: {time.monotonic() - started:.0f} s."]
    for build in dict.fromkeys(r["build"] for r in rows):
        for name in MODELS:
            for admission in (True, False):
                mine = {r["level"]: r for r in rows
                        if (r["model"], r["build"], r["admission"]) == (name, build, admission)}
                if not mine:
                    continue
                worst = max(mine.values(), key=lambda r: r["underrun_p99"])
                met = all(r["underrun_p99"] <= 0.1 for r in mine.values())
                scale = ""
                if 1 in mine and 8 in mine:
                    wall, cpu = (mine[8][k] / mine[1][k] for k in ("audio_per_s", "audio_per_cpu_s"))
                    scale = f"; concurrency 8 over 1: {wall:.2f}x by wall time, {cpu:.2f}x by server CPU time"
                lines.append(f"- {name}, {build}, admission {'on' if admission else 'off'}: worst underrun p99 "
                             f"{1000 * worst['underrun_p99']:.0f} ms (concurrency {worst['level']}; goal <= 100 ms: "
                             f"{'met' if met else 'NOT met'}), {sum(r['queued'] for r in mine.values())} requests "
                             f"queued{scale}.")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=24, help="codec frames per request (12.5 per second of audio)")
    p.add_argument("--max-level", type=int, default=8, help="highest concurrency measured")
    p.add_argument("--repeats", type=int, default=1, help="waves per level; the best by audio per CPU second counts")
    p.add_argument("--before", metavar="REV", help="also serve the waves from git revision REV first (before/after)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    started = time.monotonic()
    rows = []
    for name in args.models:
        for admission in (True, False):
            if args.before:
                with checkout(args.before) as source:
                    rows += run_model(name, admission, args.frames, args.max_level, args.repeats, source,
                                      f"before ({args.before})")
            rows += run_model(name, admission, args.frames, args.max_level, args.repeats,
                              build="after" if args.before else "this revision")
    body = table(rows, args.frames, args.repeats, started)
    print(body)
    if not args.no_write:
        write_section("TTS under load", "benchmarks/bench_tts_load.py", body)


if __name__ == "__main__":
    main()
