"""Step mode against request mode, per diffusion family of the zoo, in one script.

Decides which families default to `step_execution: true` (issue 30, item 7): step mode
where its throughput is within 5% of request mode's. For every diffusion family in the zoo
(tiny size, the zoo's default call: 4 steps, CFG on, fp32 on CPU, one thread), two
`Omni` instances over the family's bundled deploy file, one per mode, both with
`max_num_seqs=8` (so step mode has room to mix requests; a family's own cap, e.g. one
request at a time, still applies to both):

- throughput: 8 requests (8 prompts, seeds 0-7) submitted through the orchestrator,
  request i at i * gap with gap = one denoising step of a lone request, so in step mode
  every step has a joiner at another timestep (the worst case for batching mixed
  requests). Measured as requests per second = 8 / (first submit -> last finish), and as
  the process's CPU seconds for the run, whose ratio decides the default (the wall clock of
  a shared machine moves with other jobs);
- short behind long: a 2-step request submitted as soon as a 10-step one has reported
  its first step; the short one's latency (submit -> finished output).

Warmed up by lone requests in each mode, then `--repeats` throughput rounds interleaved
(request, step, request, ...), each a throughput run and a short-behind-long run: the best of
the rounds counts for each number. Default 2 rounds, so the whole run stays near 8 minutes on
two shared cores (a round of the tiny HunyuanVideo or Qwen-Image-Edit-Plus takes 40-80 s).
Writes "## Step mode vs request mode" in benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/bench_step_mode.py [--models z-image flux ...] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import queue
import time

import torch

from bench_diffusion import NUM_REQUESTS, ROOT, call_kwargs, stage_requests
from common import write_section

MODES = ("request", "step")
LONG_STEPS, SHORT_STEPS = 10, 2
THRESHOLD = 0.95  # step mode becomes a family's default at >= 0.95x request mode's throughput
# Families whose call needs an input image the zoo call leaves out (edit / animate).
NEEDS_IMAGE = {"wan-i2v", "qwen-image-edit", "hunyuan-video-i2v", "longcat-image-edit", "qwen-image-layered",
               "sana-video-i2v", "joyai-image-edit", "ltx2-i2v"}
# Families whose diffusers call takes no size (it follows the input image, at about a megapixel):
# run at the tiny side like the others; their zoo call leaves height/width out.
TINY_SIZE = {"longcat-image-edit", "qwen-image-layered"}
# Families that only continue an upstream stage's latents (no request of their own to time here).
NEEDS_UPSTREAM = {"sdxl-refiner"}


def diffusion_families() -> list[str]:
    from omnistage.testing import list_models

    return [m.name for m in list_models() if m.kind == "diffusion" and m.name not in NEEDS_UPSTREAM]


def family_kwargs(model: str) -> dict:
    """The zoo call at tiny, with an input image where the family needs one (and the tiny size
    where diffusers' call takes none), and without
    max_sequence_length where our request checker refuses it (the zoo call is diffusers':
    Qwen-Image-Edit's takes it, ours computes no such bound)."""
    from omnistage.diffusion.registry import pipeline_class
    from omnistage.testing import get_model

    kwargs = call_kwargs(model, "tiny")
    if "max_sequence_length" not in pipeline_class(get_model(model).reference_class.split(".")[-1]).extras:
        kwargs.pop("max_sequence_length", None)
    if model in NEEDS_IMAGE:
        from omnistage.testing.diffusion_models import default_input_image

        kwargs["image"] = default_input_image()
    if model in TINY_SIZE:
        kwargs["height"] = kwargs["width"] = get_model(model).sides["tiny"]
    return kwargs


def open_omni(path: str, step: bool):
    from omnistage import Omni

    return Omni(path, max_num_seqs=NUM_REQUESTS, step_execution=step)


def requests(omni, kwargs: dict, prefix: str, steps: int | None = None) -> list:
    """The 8 bench requests as orchestrator requests (`steps` overrides the step count)."""
    out = []
    for r in stage_requests(kwargs, prefix=prefix):
        params = r.params if steps is None else r.params.model_copy(update={"num_inference_steps": steps})
        out.append(omni.async_omni.make_request(r.inputs, params, request_id=r.request_id))
    return out


def run_staggered(omni, reqs: list, gap: float) -> tuple[float, float]:
    """Submit request i at i * gap; (wall, CPU) seconds from the first submit to the last
    finished output. CPU time is this process's, every thread: the work the run took, which
    other jobs on a shared machine inflate far less than the wall clock."""
    orchestrator, done = omni.async_omni.orchestrator, queue.Queue()
    cpu0 = time.process_time()
    start, pending, left = time.perf_counter(), list(enumerate(reqs)), len(reqs)
    while left:
        now = time.perf_counter() - start
        while pending and pending[0][0] * gap <= now:
            orchestrator.submit(pending.pop(0)[1], sink=done.put)
        timeout = max(1e-4, pending[0][0] * gap - now) if pending else None
        try:
            out = done.get(timeout=timeout)
        except queue.Empty:
            continue
        if out.finished:
            assert out.error is None, out.error
            left -= 1
    return time.perf_counter() - start, time.process_time() - cpu0


def short_behind_long(omni, kwargs: dict, tag: str) -> float:
    """Latency of a SHORT_STEPS request submitted once a LONG_STEPS one has taken its first step."""
    orchestrator, done = omni.async_omni.orchestrator, queue.Queue()
    long, = requests(omni, kwargs, f"long{tag}-", LONG_STEPS)[:1]
    short = requests(omni, kwargs, f"short{tag}-", SHORT_STEPS)[1]
    orchestrator.submit(long, sink=done.put)
    submitted, latency, left = None, None, 2
    while left:
        out = done.get()
        if out.finished:
            assert out.error is None, out.error
            left -= 1
            if out.request_id == short.request_id:
                latency = time.perf_counter() - submitted
        if submitted is None and out.request_id == long.request_id:  # the long one is running
            submitted = time.perf_counter()
            orchestrator.submit(short, sink=done.put)
    return latency


def one_step_time(omni, kwargs: dict) -> float:
    """Seconds per denoising step of a lone request (its second run: the first pays one-off costs)."""
    run_staggered(omni, requests(omni, kwargs, "cold")[:1], 0.0)
    return run_staggered(omni, requests(omni, kwargs, "solo")[:1], 0.0)[0] / kwargs["num_inference_steps"]


def bench(model: str, repeats: int) -> dict:
    from omnistage.testing import ensure

    path = str(ensure(model, size="tiny", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    kwargs = family_kwargs(model)
    t_start = time.perf_counter()
    omnis = {mode: open_omni(path, mode == "step") for mode in MODES}
    try:
        with torch.inference_mode():
            gap = one_step_time(omnis["request"], kwargs)
            run_staggered(omnis["step"], requests(omnis["step"], kwargs, "warm")[:1], 0.0)
            secs = {m: float("inf") for m in MODES}
            cpu, short = dict(secs), dict(secs)
            for i in range(repeats):
                for mode in MODES:
                    omni = omnis[mode]
                    wall, used = run_staggered(omni, requests(omni, kwargs, f"{mode}{i}-"), gap)
                    secs[mode], cpu[mode] = min(secs[mode], wall), min(cpu[mode], used)
                    short[mode] = min(short[mode], short_behind_long(omni, kwargs, f"{mode}{i}"))
    finally:
        for omni in omnis.values():
            omni.close()
    return {"model": model, "gap": gap, "secs": secs, "cpu": cpu, "short": short, "wall": time.perf_counter() - t_start}


def cpu_ratio(row: dict) -> float:
    """Step mode's throughput over request mode's, by CPU time: what the default follows."""
    return row["cpu"]["request"] / row["cpu"]["step"]


def table(rows: list[dict]) -> str:
    lines = ["| family | one step | request mode: req/s wall (CPU s) | step mode: req/s wall (CPU s) "
             "| step / request throughput, wall | **by CPU time** "
             f"| {SHORT_STEPS}-step behind {LONG_STEPS}-step: request mode | step mode | default |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, c, short = r["secs"], r["cpu"], r["short"]
        lines.append(f"| {r['model']} | {r['gap'] * 1000:.0f} ms | {NUM_REQUESTS / s['request']:.2f} ({c['request']:.3f}) "
                     f"| {NUM_REQUESTS / s['step']:.2f} ({c['step']:.3f}) | {s['request'] / s['step']:.3f} "
                     f"| **{cpu_ratio(r):.3f}** | {short['request']:.2f} s | {short['step']:.2f} s "
                     f"| {'step' if cpu_ratio(r) >= THRESHOLD else 'request'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=None, help="default: every diffusion family in the zoo")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only, leave RESULTS.md alone")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()
    rows = []
    for model in args.models or diffusion_families():
        rows.append(bench(model, args.repeats))
        print(table(rows[-1:]).splitlines()[-1], f"({rows[-1]['wall']:.0f} s)", flush=True)
    end = os.getloadavg()
    near = ", ".join(f"{r['model']} {cpu_ratio(r):.3f}" for r in rows if abs(cpu_ratio(r) - THRESHOLD) <= 0.03)
    body = table(rows) + f"""

Throughput: best of {args.repeats} rounds, request and step mode interleaved, per family: 8
requests, request i submitted at i * "one step" (a lone request's denoising step), through
`Omni`'s orchestrator, max_num_seqs=8 in both modes, the family's bundled deploy file
otherwise. Wall: requests per second over the run (best round). CPU: the process's CPU
seconds for the run (best round); "by CPU time" is request mode's CPU seconds over step
mode's, the throughput ratio on a saturated machine, and far less moved by other jobs than
the wall clock on this shared one. "default" is the rule of issue 30 on that ratio: step
mode where its throughput is at least {THRESHOLD}x request mode's. The short-behind-long
columns (best of the rounds too): latency of a {SHORT_STEPS}-step request submitted as soon as a
{LONG_STEPS}-step one has taken its first step. Load average (1, 5, 15 min): {load[0]:.2f}, {load[1]:.2f},
{load[2]:.2f} at the start, {end[0]:.2f}, {end[1]:.2f}, {end[2]:.2f} at the end, on 2 cores shared with other jobs.

One run on a shared machine: the wall-clock columns swing by tens of percent with the
other jobs, and even the CPU ratio is only good to a few percent; families within 0.03 of
the threshold ({near or "none"}) could land on either side in another run. The defaults
follow this run, declared in each family's `StageSpec.defaults` with the ratio beside
them. Where a family's bundled deploy file keeps max_num_seqs at 1 (the video families;
Qwen-Image-Edit and Edit-Plus off CPU), step mode changes nothing until max_num_seqs is
raised: with one request per batch, a short request still waits behind a long one.
"""
    print(body)
    if not args.no_write:
        write_section("Step mode vs request mode", "benchmarks/bench_step_mode.py", body)


if __name__ == "__main__":
    main()
