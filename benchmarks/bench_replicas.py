"""Replicas: throughput of 2 copies of a stage against 1, p99 latency while a copy is killed
under load, and the memory sleep levels 1 and 2 free.

Through `AsyncOmni` (the user's path) on the zoo's Z-Image and qwen2-llm, each stage a
`runtime: process` stage (so 1 and 2 copies pay the same process hop), one torch thread
per copy (OMP_NUM_THREADS=1, which the stage processes inherit):

- throughput: a burst sent at once that saturates one copy (`REQUESTS`: Z-Image 8 of the zoo's
  call, qwen2-llm 64 of 64 greedy tokens), timed until the last finishes, after one warm-up
  burst; both stages run side by side and their bursts take turns (1, 2, 1, 2, ...), best of
  `--repeats` per side; goal: 2 copies >= 1.8x the requests per second of 1.
  The CPU each process used during the timed bursts is printed too (was a core free per copy?);
- kill: Z-Image on 2 copies, a closed loop of `--kill-requests` requests, 4 in flight;
  p99 latency of a run where copy 0 gets SIGKILL once a quarter of them finished, over the
  p99 of the same run without a kill; goal <= 2x, and no request lost (every one answered
  with its image: the killed copy's requests re-run on the other); also how long after the
  SIGKILL each re-run was dispatched, and what the surviving copy held when it arrived;
- autoscaling: Z-Image with `max_replicas: 2` starting from 1 copy, a closed loop of 24
  requests, 8 in flight: when the second copy was started and joined after the burst
  began (time to scale up), and the burst's requests per second against 1 and 2 fixed copies;
- sleep: RSS of the 1-copy stage process after a warm-up, then asleep at level 1 and at
  level 2 (each woken again, the wake from level 2 timed, and the output after it checked
  against the one before). On CPU level 1 moves no weights (they are host memory already):
  it frees the caches and hands the allocator's free pages back, so what level 2 frees
  beyond level 1 is the weights' memory; goal: >= 90% of the bytes the engine dropped.

Two cores shared with other jobs cannot show a 2x from 2 copies: the load average at the
start and end is printed beside the table. Writes "## Replicas" (throughput, kill, autoscaling) and
"## Sleep and wake" in RESULTS.md; `--only sleep` or `--only replicas` runs and writes one.

    .venv/bin/python benchmarks/bench_replicas.py [--size small] [--repeats 3] [--only sleep]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per copy; the stage processes inherit it

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from common import ROOT, write_section  # noqa: E402

LLM_TOKENS = 64
REQUESTS = {"z-image": 8, "qwen2-llm": 64}
"""Requests per throughput burst: enough that one copy is saturated (runs several batches, each
`max_num_seqs` wide: Z-Image 4, qwen2-llm 8), so a second copy has work to take over. A qwen2-llm
decode step on the small model costs about the same for 4 rows as for 8, so a burst of one batch
(8 requests) takes as long on 2 copies (4 rows each) as on 1: it measures a step's latency, not
throughput."""
ONE_BATCH = {"qwen2-llm": 8}
"""Also timed, with no goal: a burst of one batch, which shows the above."""
SCALE_MODEL, SCALE_REQUESTS = "z-image", 24
"""The autoscaling burst: a closed loop of 24 requests, 8 in flight (2 copies' worth at a target of 4)."""


def params_for(model: str, size: str):
    from omnistage import SamplingParams
    from omnistage.diffusion.params import DiffusionParams
    from omnistage.testing.zoo import call_kwargs

    if model == "qwen2-llm":
        return "Tell me a story about a cat", SamplingParams(max_tokens=LLM_TOKENS, temperature=0, ignore_eos=True)
    kwargs = dict(call_kwargs(model, size))
    prompt = kwargs.pop("prompt")
    extras = {"max_sequence_length": kwargs.pop("max_sequence_length")}
    return prompt, DiffusionParams(**kwargs, seed=0, extras=extras)


def start(model: str, size: str, num_replicas: int, **fields):
    from omnistage.entrypoints.omni import AsyncOmni
    from omnistage.testing import ensure

    path = ensure(model, size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo")
    return AsyncOmni(path, stage_overrides={"0": {"runtime": "process", "num_replicas": num_replicas,
                                                  "restart_backoff_s": 0.2, **fields}})


async def one(omni, prompt, params, rid: str) -> tuple[float, object]:
    started = time.perf_counter()
    last = None
    async for out in omni.generate(prompt, params, request_id=rid):
        last = out
    return time.perf_counter() - started, last


async def burst(omni, prompt, params, n: int, tag: str) -> float:
    started = time.perf_counter()
    outs = await asyncio.gather(*(one(omni, f"{prompt} {i}", params, f"{tag}-{i}") for i in range(n)))
    assert all(out.error is None for _, out in outs), [out.error for _, out in outs if out.error]
    return time.perf_counter() - started


async def closed_loop(omni, prompt, params, n: int, kill_after: int | None, tag: str, in_flight: int = 4) -> dict:
    """`n` requests, `in_flight` at a time; copy 0 gets SIGKILL once `kill_after` finished.
    Latencies, errors, when the kill was sent (time.monotonic) and the seconds it all took."""
    latencies, errors, todo = [], 0, list(range(n))
    started = time.perf_counter()
    killed_at = None

    async def worker():
        nonlocal errors, killed_at
        while todo:
            i = todo.pop(0)
            seconds, out = await one(omni, f"{prompt} {i}", params, f"{tag}-{i}")
            latencies.append(seconds)
            errors += out.error is not None
            if kill_after is not None and killed_at is None and len(latencies) >= kill_after:
                killed_at = time.monotonic()
                os.kill(copy_pids(omni)[0], signal.SIGKILL)

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return {"latencies": latencies, "errors": errors, "killed_at": killed_at,
            "seconds": time.perf_counter() - started}


def copy_pids(omni) -> list[int]:
    handle = omni.orchestrator.handles[0]
    return [r.endpoint.pid for r in getattr(handle, "replicas", [handle])]


class CpuUse:
    """CPU seconds over its spans (entered once per timed burst) of this process (the orchestrator
    and the client), of each stage copy, and of every other process on the host (its busy time
    less ours), each as a share of one core: did each copy have a core to itself? And ours in all
    per request: what the work costs, however busy the machine is."""

    def __init__(self, pids: list[int], num_requests: int):
        self.procs = [psutil.Process(os.getpid())] + [psutil.Process(pid) for pid in pids]
        self.num_requests = num_requests
        self.seconds = [0.0] * len(self.procs)
        self.host_seconds = self.wall = 0.0

    def __enter__(self) -> "CpuUse":
        self._start = [self._cpu(p) for p in self.procs]
        self._busy = self._host_busy()
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.wall += time.perf_counter() - self._wall
        self.host_seconds += self._host_busy() - self._busy
        self.seconds = [total + self._cpu(p) - c for total, p, c in zip(self.seconds, self.procs, self._start)]

    def include_started(self, pid: int) -> None:
        """Count a process that started during the spans (a copy added by autoscaling): all its CPU."""
        self.procs.append(psutil.Process(pid))
        self.seconds.append(self._cpu(self.procs[-1]))

    @staticmethod
    def _cpu(proc: psutil.Process) -> float:
        times = proc.cpu_times()
        return times.user + times.system

    @staticmethod
    def _host_busy() -> float:
        times = psutil.cpu_times()  # steal: taken by other guests of a virtual host
        return sum(getattr(times, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))

    def describe(self) -> str:
        main, *copies = (s / self.wall for s in self.seconds)
        others = max(0.0, self.host_seconds - sum(self.seconds)) / self.wall
        per_request_ms = 1000 * sum(self.seconds) / self.num_requests
        shares = ", ".join([f"main {main:.0%}"] + [f"copy {i} {c:.0%}" for i, c in enumerate(copies)])
        return f"{shares}, other jobs {others:.0%} ({per_request_ms:.0f} CPU-ms per request)"


class ReplicaEvents(logging.Handler):
    """When the replica set re-ran a request (and how many requests the copy taking it held then,
    running or queued ahead of it), began starting a copy, and a started copy joined (time.monotonic)
    with the CPU it took to start."""

    def __init__(self, omni):
        super().__init__()
        self.stage = omni.orchestrator.handles[0]
        self.reruns: list[tuple[float, int]] = []
        self.starting: list[float] = []
        self.joined: list[float] = []
        self.start_cpu_s: list[float] = []
        """CPU seconds each joining copy spent starting (its load), taken from the serving ones on a busy host."""

    def emit(self, record: logging.LogRecord) -> None:
        now = time.monotonic()
        if record.msg.startswith("stage %s: re-running request"):
            target = next(r for r in self.stage.replicas if r.label == record.args[2])
            self.reruns.append((now, len(target.held)))
        elif record.msg.startswith("stage %s: starting copy"):
            self.starting.append(now)
        elif record.msg.startswith("stage %s: copy %d joined"):
            times = psutil.Process(self.stage.replicas[-1].endpoint.pid).cpu_times()  # the copy just appended
            self.joined.append(now)
            self.start_cpu_s.append(times.user + times.system)

    def __enter__(self) -> "ReplicaEvents":
        logger = logging.getLogger("omnistage.engine.replicas")
        logger.addHandler(self)
        self._level, logger.level = logger.level, min(logger.level or logging.INFO, logging.INFO)
        return self

    def __exit__(self, *exc) -> None:
        logger = logging.getLogger("omnistage.engine.replicas")
        logger.removeHandler(self)
        logger.setLevel(self._level)


def stage_rss(omni) -> int:
    return psutil.Process(omni.orchestrator.handles[0].endpoint.pid).memory_info().rss


def payload(out) -> object:
    return np.asarray(out.images[0]) if out.images else out.token_ids


def bench(models: list[str], size: str, repeats: int, kill_requests: int, parts: set[str]) -> dict:
    results: dict = {"throughput": {}, "one_batch": {}, "cpu": {}, "kill": None, "scale": None, "sleep": {}}
    for model in models:
        prompt, params = params_for(model, size)
        if "replicas" not in parts:
            omni = start(model, size, 1)
            try:
                results["sleep"][model] = measure_sleep(omni, prompt, params)
            finally:
                omni.close()
            continue
        stages = {}
        try:
            for num_replicas in (1, 2):
                stages[num_replicas] = start(model, size, num_replicas)
            measure_throughput(results, model, stages, prompt, params, repeats)
            if model == SCALE_MODEL:  # the autoscaled burst's yardsticks: fixed 1 and 2 copies
                fixed, fixed_cpu = {}, {}
                for k, omni in stages.items():
                    with CpuUse(copy_pids(omni), SCALE_REQUESTS) as fixed_cpu[k]:
                        loop = asyncio.run(closed_loop(omni, prompt, params, SCALE_REQUESTS, None, "f", in_flight=8))
                    fixed[k] = SCALE_REQUESTS / loop["seconds"]
            if model == "z-image":
                results["kill"] = measure_kill(stages[2], prompt, params, kill_requests)
            if "sleep" in parts:
                results["sleep"][model] = measure_sleep(stages[1], prompt, params)
        finally:
            for omni in stages.values():
                omni.close()
        if model == SCALE_MODEL:
            results["scale"] = {"fixed": fixed, "fixed_cpu": fixed_cpu,
                                **measure_scale_up(model, size, prompt, params, SCALE_REQUESTS)}
    return results


def measure_throughput(results: dict, model: str, stages: dict, prompt, params, repeats: int) -> None:
    """Best of `repeats` bursts on 1 copy and on 2, taken in turn (1, 2, 1, 2, ...), so a change in
    what other jobs run on the host falls on both sides alike."""
    requests = REQUESTS[model]
    cpu = {k: CpuUse(copy_pids(omni), requests * repeats) for k, omni in stages.items()}
    times: dict = {k: [] for k in stages}
    one_batch: dict = {k: [] for k in stages}
    for omni in stages.values():
        asyncio.run(burst(omni, prompt, params, requests, "warm"))
    for r in range(repeats):
        for k, omni in stages.items():
            with cpu[k]:
                times[k].append(asyncio.run(burst(omni, prompt, params, requests, f"t{r}")))
            if model in ONE_BATCH:
                one_batch[k].append(asyncio.run(burst(omni, prompt, params, ONE_BATCH[model], f"o{r}")))
    results["throughput"][model] = {k: min(t) for k, t in times.items()}
    results["cpu"][model] = cpu
    if model in ONE_BATCH:
        results["one_batch"][model] = {k: min(t) for k, t in one_batch.items()}
    for k in stages:
        print(f"{model} x{k}: {requests / min(times[k]):.2f} req/s; CPU {cpu[k].describe()}", flush=True)


def measure_kill(omni, prompt, params, n: int) -> dict:
    """The closed loop without and with a kill; for the kill, how long the re-runs took to be
    dispatched after the SIGKILL and how much the surviving copy held ahead of each."""
    base = asyncio.run(closed_loop(omni, prompt, params, n, None, "k0"))
    with ReplicaEvents(omni) as events:
        hit = asyncio.run(closed_loop(omni, prompt, params, n, n // 4, "k1"))
    return {"base": base["latencies"], "hit": hit["latencies"], "errors": base["errors"] + hit["errors"],
            "reruns": omni.orchestrator.handles[0].num_reruns,
            "detect_s": [at - hit["killed_at"] for at, _ in events.reruns], "ahead": [n for _, n in events.reruns]}


def measure_scale_up(model: str, size: str, prompt, params, n: int) -> dict:
    """A stage of 1 copy that may grow to 2 (`target_outstanding_per_replica` 4) meets a closed loop
    of `n` requests, 8 in flight: when the second copy was started and when it joined, after the
    burst began, and the burst's requests per second."""
    omni = start(model, size, 1, max_replicas=2, target_outstanding_per_replica=4, scale_down_delay_s=600)
    try:
        asyncio.run(burst(omni, prompt, params, 1, "warm"))
        with ReplicaEvents(omni) as events, CpuUse(copy_pids(omni), n) as cpu:
            began = time.monotonic()
            loop = asyncio.run(closed_loop(omni, prompt, params, n, None, "a", in_flight=8))
        assert loop["errors"] == 0, loop
        for pid in copy_pids(omni)[1:]:
            cpu.include_started(pid)
        return {"cpu": cpu, "start_s": events.starting[0] - began if events.starting else None,
                "join_s": events.joined[0] - began if events.joined else None,
                "start_cpu_s": events.start_cpu_s[0] if events.start_cpu_s else None,
                "rate": n / loop["seconds"]}
    finally:
        omni.close()


def measure_sleep(omni, prompt, params) -> dict:
    async def go():
        _, before = await one(omni, prompt, params, "s-before")
        awake = stage_rss(omni)
        rss, said, wake_s = {}, {}, {}
        for level in (1, 2):
            said[level] = await omni.sleep(level)
            rss[level] = stage_rss(omni)
            started = time.perf_counter()
            await omni.wake_up()
            wake_s[level] = time.perf_counter() - started
        _, after = await one(omni, prompt, params, "s-after")
        same = np.array_equal(np.asarray(payload(before)), np.asarray(payload(after)))
        return {"awake": awake, "rss": rss, "said": said, "wake_s": wake_s, "same": same}

    return asyncio.run(go())


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99))


def table(results: dict, size: str, loads: tuple) -> str:
    rows = ["| Measure | 1 copy | 2 copies | Ratio | Goal |", "|---|---|---|---|---|"]
    for model, best in results["throughput"].items():
        requests = REQUESTS[model]
        r1, r2 = requests / best[1], requests / best[2]
        met = "met" if r2 / r1 >= 1.8 else "**missed**"
        what = f"{requests} requests at once" + (f", {LLM_TOKENS} tokens each" if model == "qwen2-llm" else "")
        rows.append(f"| {model} {size}: throughput, {what} (req/s) | {r1:.2f} | {r2:.2f} | "
                    f"{r2 / r1:.2f}x | >= 1.8x: {met} |")
    for model, best in results["one_batch"].items():
        r1, r2 = ONE_BATCH[model] / best[1], ONE_BATCH[model] / best[2]
        rows.append(f"| {model} {size}: one batch, {ONE_BATCH[model]} requests at once, {LLM_TOKENS} tokens each "
                    f"(req/s) | {r1:.2f} | {r2:.2f} | {r2 / r1:.2f}x | none: a step's latency, not throughput |")
    kill = results["kill"]
    if kill is not None:
        ratio = p99(kill["hit"]) / p99(kill["base"])
        met = "met" if ratio <= 2 and kill["errors"] == 0 else "**missed**"
        rows.append(f"| z-image {size}, 2 copies: p99 latency (s), no kill / copy 0 killed | {p99(kill['base']):.2f} | "
                    f"{p99(kill['hit']):.2f} | {ratio:.2f}x | <= 2x, 0 lost: {met} ({kill['errors']} lost, "
                    f"{kill['reruns']} re-run) |")
    scale = results["scale"]
    if scale is not None:
        join = ("never" if scale["join_s"] is None else
                f"{scale['join_s']:.2f} s (its start took {scale['start_cpu_s']:.1f} CPU-s)")
        rows.append(f"| {SCALE_MODEL} {size}: a burst of {SCALE_REQUESTS} requests, 8 in flight (req/s); fixed "
                    f"copies / autoscaled from 1 (max 2) | {scale['fixed'][1]:.2f} | {scale['fixed'][2]:.2f} | "
                    f"{scale['rate']:.2f} ({scale['rate'] / scale['fixed'][1]:.2f}x of 1 copy) | time to scale up: "
                    f"the second copy started {scale['start_s']:.2f} s and joined {join} after the burst began |")
    cpu = "; ".join(f"{model}, {k} cop{'y' if k == 1 else 'ies'}: {use.describe()}"
                    for model, uses in results["cpu"].items() for k, use in uses.items())
    note = (f"Load average (1 min) at the start and the end: {loads[0]:.1f} / {loads[1]:.1f}, on "
            f"{os.cpu_count()} cores shared with other jobs; one torch thread per copy; throughput is the best of "
            f"the timed bursts, the 1-copy and 2-copy stages taking turns. CPU during the timed bursts (share of "
            f"one core; main = orchestrator and client): {cpu}. Sleep: the next section.")
    if scale is not None:
        note += (f"\n\nCPU during the autoscaling bursts: 1 copy: {scale['fixed_cpu'][1].describe()}; 2 copies: "
                 f"{scale['fixed_cpu'][2].describe()}; autoscaled: {scale['cpu'].describe()}.")
    if kill is not None:
        detect = ", ".join(f"{1000 * s:.0f}" for s in kill["detect_s"])
        note += (f"\n\nKill: the re-runs were dispatched {detect} ms after the SIGKILL; the surviving copy held "
                 f"{', '.join(map(str, kill['ahead']))} request(s) (running or queued) when each arrived.")
    return "\n".join(rows) + "\n\n" + note


def sleep_table(results: dict, size: str, loads: tuple) -> str:
    mib = 2**20
    rows = ["| Model | Awake RSS (MiB) | Level 1: RSS freed (engine freed) | Level 2: RSS freed (engine freed) | "
            "Level 2 beyond level 1: RSS freed / weights dropped (MiB) | Wake from level 2 (s) | Same output | "
            "Goal >= 90% |", "|---|---|---|---|---|---|---|---|"]
    for model, r in results["sleep"].items():
        rss, said = r["rss"], r["said"]
        beyond, weights = rss[1] - rss[2], said[2] - said[1]
        share = beyond / weights if weights else 0.0
        rows.append(f"| {model} {size} | {r['awake'] / mib:.0f} | {(r['awake'] - rss[1]) / mib:.1f} "
                    f"({said[1] / mib:.1f}) | {(r['awake'] - rss[2]) / mib:.1f} ({said[2] / mib:.1f}) | "
                    f"{beyond / mib:.1f} / {weights / mib:.1f} | {r['wake_s'][2]:.2f} | "
                    f"{'yes' if r['same'] else '**no**'} | {share:.0%}: {'met' if share >= 0.9 else '**missed**'} |")
    note = (f"Load average (1 min) at the start and the end: {loads[0]:.1f} / {loads[1]:.1f}, on "
            f"{os.cpu_count()} cores shared with other jobs. One stage process (`runtime: process`) per model, "
            f"RSS read right after each sleep returns. On CPU the weights already live in host memory: level 1 "
            f"frees the caches (qwen2's KV pools) and, like every sleep, hands the allocator's free pages back "
            f"to the OS (`malloc_trim`), which includes the activations the warm-up generation left in the heap; "
            f"what level 2 frees beyond level 1 is the weights' memory. The engine's count includes the packed "
            f"CPU copies of the AR linears. RSS can exceed it where weights are views of the checkpoint file's "
            f"mapping, whose pages (the whole file, read once at load) leave when the last view does.")
    return "\n".join(rows) + "\n\n" + note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["z-image", "qwen2-llm"])
    parser.add_argument("--size", default="small")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kill-requests", type=int, default=16)
    parser.add_argument("--only", choices=("replicas", "sleep"),
                        help="run and write one section: replicas (throughput, kill) or sleep")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    parts = {args.only} if args.only else {"replicas", "sleep"}
    load_start = os.getloadavg()[0]
    results = bench(args.models, args.size, args.repeats, args.kill_requests, parts)
    loads = (load_start, os.getloadavg()[0])
    sections = []
    if "replicas" in parts:
        sections.append(("Replicas", table(results, args.size, loads)))
    if "sleep" in parts:
        sections.append(("Sleep and wake", sleep_table(results, args.size, loads)))
    for heading, text in sections:
        print(text)
        if not args.no_write:
            write_section(heading, "benchmarks/bench_replicas.py", text)


if __name__ == "__main__":
    main()
