"""Summaries of a benchmark run: percentiles, throughput, a table, JSON and charts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from omnistage.bench.runner import BenchRun


def summarize(run: BenchRun) -> dict:
    ok = [r for r in run.results if r.ok]
    lat = np.array([r.latency for r in ok]) if ok else np.array([])
    ttfp = np.array([r.ttfp for r in ok if r.ttfp is not None])
    cfg = run.config

    def pct(a: np.ndarray, q: float) -> float | None:
        return float(np.percentile(a, q)) if a.size else None

    audio = sum(r.audio_seconds for r in ok)
    streamed = [r for r in ok if r.ttfp is not None and r.audio_seconds > 0]
    stalled = np.array([sum(r.underruns) for r in streamed])  # per stream: time its player waited
    summary = {
        "task": cfg.task, "base_url": cfg.base_url, "num_prompts": len(run.results),
        "max_concurrency": cfg.max_concurrency,
        "request_rate": None if cfg.request_rate == float("inf") else cfg.request_rate,
        "duration_s": run.duration, "completed": len(ok), "errors": len(run.results) - len(ok),
        "first_errors": [r.error for r in run.results if not r.ok][:5],
        "latency_mean_s": float(lat.mean()) if lat.size else None,
        "latency_p50_s": pct(lat, 50), "latency_p95_s": pct(lat, 95), "latency_p99_s": pct(lat, 99),
        "requests_per_s": len(ok) / run.duration if run.duration else None,
        "images_per_s": sum(r.images for r in ok) / run.duration if run.duration else None,
        "video_frames_per_s": sum(r.frames for r in ok) / run.duration if run.duration else None,
        "audio_seconds_per_s": audio / run.duration if run.duration else None,
        "tokens_per_s": sum(r.tokens for r in ok) / run.duration if run.duration else None,
        "ttfp_p50_s": pct(ttfp, 50), "ttfp_p95_s": pct(ttfp, 95), "ttfp_p99_s": pct(ttfp, 99),
        "rtf_mean": (float(np.mean([r.latency / r.audio_seconds for r in ok if r.audio_seconds > 0]))
                     if any(r.audio_seconds > 0 for r in ok) else None),
        "underruns": sum(len(r.underruns) for r in streamed) if streamed else None,
        "streams_with_underruns": int((stalled > 0).sum()) if streamed else None,
        "underrun_p99_s": pct(stalled, 99),
        "latencies_s": [r.latency for r in ok],
    }
    return summary


_ROWS = [("completed", "completed"), ("errors", "errors"), ("duration_s", "duration (s)"),
         ("latency_mean_s", "latency mean (s)"), ("latency_p50_s", "latency p50 (s)"),
         ("latency_p95_s", "latency p95 (s)"), ("latency_p99_s", "latency p99 (s)"),
         ("requests_per_s", "requests/s"), ("images_per_s", "images/s"), ("video_frames_per_s", "video frames/s"),
         ("audio_seconds_per_s", "audio s / wall s"), ("tokens_per_s", "tokens/s"),
         ("ttfp_p50_s", "time to first packet p50 (s)"), ("ttfp_p95_s", "time to first packet p95 (s)"),
         ("ttfp_p99_s", "time to first packet p99 (s)"),
         ("rtf_mean", "real-time factor mean"), ("underruns", "player underruns"),
         ("streams_with_underruns", "streams with underruns"), ("underrun_p99_s", "underrun per stream p99 (s)")]


_ALWAYS = ("completed", "errors", "underruns", "streams_with_underruns")  # shown even at 0


def format_table(summary: dict) -> str:
    lines = [f"== omnistage bench: task={summary['task']} concurrency={summary['max_concurrency']} "
             f"prompts={summary['num_prompts']} =="]
    for key, label in _ROWS:
        value = summary.get(key)
        if value is None or (value == 0 and key not in _ALWAYS):
            continue
        lines.append(f"{label:32s} {value:.4f}" if isinstance(value, float) else f"{label:32s} {value}")
    for err in summary["first_errors"]:
        lines.append(f"error: {err}")
    return "\n".join(lines)


def write_json(summary: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(summary, indent=2))


def write_plots(summaries: list[dict], out_dir: str | Path) -> list[Path]:
    """Latency CDF per concurrency, and throughput against concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for s in summaries:
        lat = np.sort(s["latencies_s"])
        if lat.size:
            ax.plot(lat, np.arange(1, lat.size + 1) / lat.size, label=f"concurrency {s['max_concurrency']}")
    ax.set(xlabel="latency (s)", ylabel="fraction of requests", title=f"latency CDF ({summaries[0]['task']})")
    ax.legend()
    cdf = out / "latency_cdf.png"
    fig.savefig(cdf, dpi=100, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [s["max_concurrency"] for s in summaries]
    ax.plot(xs, [s["requests_per_s"] or 0 for s in summaries], marker="o")
    ax.set(xlabel="max concurrency", ylabel="requests/s", title="throughput against concurrency")
    thr = out / "throughput.png"
    fig.savefig(thr, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return [cdf, thr]
