"""Parallel diffusion on CPU ranks: 2 ranks x 1 thread against 1 rank x 1 thread, in one script.

One request at a time through `DiffusionEngine` with `executor: mp` (the user's path), the
zoo's small Qwen-Image (256x256, true CFG) and Wan T2V (128x128, 9 frames, CFG), 20 steps:

- baseline: num_devices=1 (one worker process, one torch thread);
- CFG parallel: num_devices=2, cfg_parallel_size=2 (goal >= 1.6x);
- Ulysses 2: num_devices=2, ulysses_degree=2 (goal >= 1.4x on Wan).

Each engine is started once, warmed up with one request, then timed `--repeats` times; the
best request latency counts. Then VAE decode alone (no engine): peak RSS growth of one
decode in a fresh process per configuration, tiled against untiled, for a 1024x1024 image
(Qwen-Image's VAE, its own 256-px tiles) and a 33-frame 256x256 video (Wan's VAE, 128-px
tiles: its default 256-px ones would not split the frame), with the time ratio
(goal <= 0.5x memory). Prints markdown and writes "## Parallel diffusion" in RESULTS.md.

`--tensor-parallel` times tensor_parallel_size=2 against 1 rank instead, on the small zoo
models of the families with a tensor plan (`TP_MODELS`), and states each rank's transformer
weight bytes against the whole (goal <= 0.55x): measured on the zoo model (rank 0's shards, as
the worker cuts them) and at the published size (the transformer class built on the meta
device: omnistage.testing.published_sizes). Writes
"## Parallel diffusion: tensor parallel".

    .venv/bin/python benchmarks/bench_parallel.py [--steps 20] [--repeats 2] [--tensor-parallel]

With `--fsdp`, instead: FSDP (`fsdp_degree: 2`, 2 ranks running the same request) against
1 rank on the zoo's small Qwen-Image and Z-Image (256x256): request latency through the
engine as above, and the transformer's parameter bytes one rank holds at rest (after a
request), measured in two gloo ranks that load the pipeline as a worker does (goal <= 0.55x
of one rank's). Writes "## Parallel diffusion: FSDP".

    .venv/bin/python benchmarks/bench_parallel.py [--steps 20] [--repeats 2] [--fsdp]

With `--uneven`, instead: Ulysses 2 and ring 2 against 1 rank on the zoo's small Qwen-Image
(256x256) for a prompt of 59 text tokens, which 2 does not divide (padded and masked), and one
of 66, which it does: the three engines started together and their requests alternated, best
latency and its process CPU time per cell. Goal: the 59-token speed-up within 10% of the
66-token one. Writes "## Parallel diffusion: uneven prompts".

    .venv/bin/python benchmarks/bench_parallel.py [--steps 20] [--repeats 2] --uneven

With `--cached`, instead: a step cache under Ulysses 2 against Ulysses 2 uncached, one row per
family whose cached blocks run on a rank's shard of the sequence (the zoo's small FLUX, FLUX.2,
SD3 at 256x256 and Wan at 128x128, 9 frames; TeaCache at a threshold that computes about half
the forwards on one rank): the three engines (Ulysses 2 uncached, Ulysses 2 cached, 1 rank
cached) started together and their requests alternated; per cell the median of the timed
requests' process CPU time (and of their latency); the forwards the cached ranks computed, and
the PSNR of their output against one rank's with the same cache (the ranks decide as one rank
does: the same forwards, the same output). Writes "## Parallel diffusion: step caches under Ulysses".

    .venv/bin/python benchmarks/bench_parallel.py [--steps 20] [--repeats 3] --cached
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per rank, the workers inherit it

from common import PeakRSS, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"qwen-image": 256, "wan-t2v": 128, "flux2": 256, "sd3": 256, "flux": 256}  # zoo name -> side (small size)
TP_MODELS = {"wan-t2v": "WanPipeline", "flux2": "Flux2Pipeline", "sd3": "StableDiffusion3Pipeline",
             "qwen-image": "QwenImagePipeline"}
"""Zoo name -> our pipeline class, for --tensor-parallel."""
CONFIGS = {
    "1 rank": dict(num_devices=1),
    "CFG parallel": dict(num_devices=2, cfg_parallel_size=2),
    "Ulysses 2": dict(num_devices=2, ulysses_degree=2),
}
# Wan's default 256-px tiles would not split a 256-px frame: its case uses 128-px tiles, 96 apart.
WAN_TILES = dict(tile_sample_min_height=128, tile_sample_min_width=128, tile_sample_stride_height=96,
                 tile_sample_stride_width=96)
FSDP_MODELS = {"qwen-image": ("QwenImagePipeline", 256), "z-image": ("ZImagePipeline", 256)}
"""zoo name -> (pipeline class, side) of the FSDP rows."""
VAE_CASES = {"qwen-image": dict(side=1024, frames=1), "wan-t2v": dict(side=256, frames=33, tiles=WAN_TILES)}


def zoo_path(model: str) -> str:
    from omnistage.testing import ensure

    return str(ensure(model, size="small", cache_dir=ROOT / ".omnistage-cache" / "zoo"))


def request(model: str, steps: int, rid: str, prompt: str | None = None, **overrides):
    from omnistage.core.types import StageRequest
    from omnistage.diffusion.params import DiffusionParams
    from omnistage.testing import call_kwargs as zoo_call_kwargs

    side = MODELS[model] if model in MODELS else FSDP_MODELS[model][1]
    kwargs = dict(zoo_call_kwargs(model), num_inference_steps=steps, height=side, width=side, **overrides)
    if prompt is not None:
        kwargs["prompt"] = prompt
    prompt = kwargs.pop("prompt")
    fields = {k: v for k, v in kwargs.items() if k in DiffusionParams.model_fields}
    extras = {k: v for k, v in kwargs.items() if k not in DiffusionParams.model_fields}
    return StageRequest(rid, prompt, DiffusionParams(seed=0, extras=extras, **fields))


def time_engine(model: str, config: dict, steps: int, repeats: int) -> float:
    engine = start_engine(model, config)
    try:
        run_request(engine, model, steps, "warm-up")
        return min(run_request(engine, model, steps, f"r{i}")[0] for i in range(repeats))
    finally:
        engine.close()


def start_engine(model: str, config: dict):
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.engine import DiffusionEngine

    return DiffusionEngine(zoo_path(model), config=StageDeployConfig(executor="mp", **config))


def run_request(engine, model: str, steps: int, rid: str, prompt: str | None = None,
                finished: list | None = None, **overrides) -> tuple[float, float]:
    """(latency, CPU seconds of this process and its workers) of one request run to the end; its
    final output is appended to `finished` when given."""
    engine.add_request(request(model, steps, rid, prompt, **overrides))
    start, cpu = time.perf_counter(), cpu_seconds()
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.error is None, out.error
            if out.finished and finished is not None:
                finished.append(out)
    return time.perf_counter() - start, cpu_seconds() - cpu


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and every live descendant (the rank workers)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def vae_decode_child(model: str, tiled: bool) -> dict:
    """In a fresh process: RSS growth and time of one VAE decode of random latents."""
    import torch
    from diffusers import DiffusionPipeline

    torch.set_num_threads(1)
    pipe = DiffusionPipeline.from_pretrained(zoo_path(model))
    vae = pipe.vae
    if tiled:
        vae.enable_tiling(**VAE_CASES[model].get("tiles", {}))
    case = VAE_CASES[model]
    factor = 2 ** len(vae.config.temperal_downsample)
    frames = (case["frames"] - 1) // 2 ** sum(vae.config.temperal_downsample) + 1
    latents = torch.randn(1, vae.config.z_dim, frames, case["side"] // factor, case["side"] // factor)
    with torch.no_grad():
        vae.decode(latents[:, :, :1, :8, :8])  # warm up kernels before the baseline RSS
        base = PeakRSS(children=False)._sample()
        start = time.perf_counter()
        with PeakRSS(children=False, interval=0.01) as peak:
            out = vae.decode(latents, return_dict=False)[0]
        elapsed = time.perf_counter() - start
    return {"growth_mib": (peak.peak - base) / 2**20, "seconds": elapsed, "shape": list(out.shape)}


def vae_decode(model: str, tiled: bool) -> dict:
    code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import bench_parallel as b; "
            f"print('RESULT', json.dumps(b.vae_decode_child({model!r}, {tiled})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def rank_weight_bytes(model: str) -> dict[str, float]:
    """Rank 0's share of 2 of the transformer's parameter bytes: the zoo model's and the same
    class's at its published size (omnistage.testing.published_sizes)."""
    from omnistage.diffusion.registry import pipeline_class
    from omnistage.testing.published_sizes import published_transformer, rank_share

    cls = pipeline_class(TP_MODELS[model])
    zoo_model = cls.from_pretrained(zoo_path(model)).transformer
    published = published_transformer(type(zoo_model).__name__)
    gib = sum(p.numel() * p.element_size() for p in published.parameters()) / 2**30
    plans = cls.supported_accelerations.tensor_parallel
    return {"zoo": rank_share(zoo_model, plans), "published": rank_share(published, plans), "published_gib": gib}


def tensor_parallel_section(args: argparse.Namespace) -> str:
    rows = ["| model | 1 rank x 1 thread (s) | TP 2, 2 ranks (s) | speed-up | rank's transformer bytes, zoo model "
            "| at the published size — goal <= 0.55x |", "| --- | --- | --- | --- | --- | --- |"]
    for model in args.models:
        configs = {"1 rank": dict(num_devices=1), "TP 2": dict(num_devices=2, tensor_parallel_size=2)}
        t = {name: time_engine(model, config, args.steps, args.repeats) for name, config in configs.items()}
        shares = rank_weight_bytes(model)
        print(model, t, shares, flush=True)
        rows.append(f"| {model} small ({MODELS[model]} px{', 9 frames' if model == 'wan-t2v' else ''}) "
                    f"| {t['1 rank']:.2f} | {t['TP 2']:.2f} | {t['1 rank'] / t['TP 2']:.2f}x "
                    f"| {shares['zoo']:.3f}x "
                    f"| {shares['published']:.3f}x (of {shares['published_gib']:.0f} GiB fp32) |")
    return (f"One request at a time, {args.steps} steps, fp32, CPU, `executor: mp`, one torch thread per rank, "
            f"best of {args.repeats} timed requests after a warm-up; engine start not counted; load average "
            f"before the run {args.load}.\n\n" + "\n".join(rows) + "\n")


def fsdp_rank(rank: int, port: int, model: str, out_dir: str) -> None:
    """One of two gloo ranks: load the pipeline with fsdp_degree=2 as a worker does, run one
    2-step request, and write the transformer's parameter bytes this rank then holds."""
    import torch
    import torch.distributed as dist

    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.accel.fsdp import local_parameter_bytes
    from omnistage.diffusion.registry import pipeline_class
    from omnistage.diffusion.request import DiffusionRequest

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    deploy = StageDeployConfig(executor="mp", num_devices=2, fsdp_degree=2)
    pipeline = pipeline_class(FSDP_MODELS[model][0]).from_pretrained(zoo_path(model), deploy=deploy)
    staged = request(model, 2, "bytes")
    pipeline.denoise([DiffusionRequest(request_id=staged.request_id, prompt=staged.inputs, params=staged.params)])
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(local_parameter_bytes(pipeline.transformer)))
    dist.destroy_process_group()


def fsdp_bytes(model: str) -> tuple[int, int]:
    """(the transformer's parameter bytes on 1 rank, the most one of 2 FSDP ranks holds at rest)."""
    import socket
    import tempfile

    import torch.multiprocessing as mp
    from diffusers import DiffusionPipeline

    from omnistage.diffusion.accel.fsdp import local_parameter_bytes

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(fsdp_rank, args=(port, model, out_dir), nprocs=2)
        per_rank = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(2)]
    whole = local_parameter_bytes(DiffusionPipeline.from_pretrained(zoo_path(model)).transformer)
    return whole, max(per_rank)


def fsdp_main(args: argparse.Namespace) -> None:
    rows = ["| model | 1 rank: latency, CPU | FSDP 2, 2 ranks: latency, CPU | latency ratio (FSDP / 1 rank) "
            "| CPU ratio | transformer parameters, 1 rank | per FSDP rank at rest | bytes ratio — goal <= 0.55x |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model in FSDP_MODELS:
        # Both engines at once, their requests alternated, so a change in the machine's load hits both.
        engines = {"one": start_engine(model, CONFIGS["1 rank"]),
                   "fsdp": start_engine(model, dict(num_devices=2, fsdp_degree=2))}
        try:
            runs = {name: [] for name in engines}
            for i in range(args.repeats + 1):  # the first is the warm-up
                for name, engine in engines.items():
                    runs[name].append(run_request(engine, model, args.steps, f"r{i}"))
            one, fsdp = (min(runs[name][1:]) for name in engines)
        finally:
            for engine in engines.values():
                engine.close()
        whole, held = fsdp_bytes(model)
        print(model, one, fsdp, whole, held, flush=True)
        rows.append(f"| {model} small ({FSDP_MODELS[model][1]} px) | {one[0]:.2f} s, {one[1]:.2f} s "
                    f"| {fsdp[0]:.2f} s, {fsdp[1]:.2f} s | {fsdp[0] / one[0]:.2f}x | {fsdp[1] / one[1]:.2f}x "
                    f"| {whole / 2**20:.1f} MiB | {held / 2**20:.1f} MiB | {held / whole:.3f}x |")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    body = (f"One request at a time, {args.steps} steps, fp32, CPU, `executor: mp`, one torch thread per rank, "
            f"both engines started together and their requests alternated; best latency of {args.repeats} timed "
            f"requests each after a warm-up (CPU: user + system seconds of the engines and their rank processes "
            f"over that request); engine start not counted. Both FSDP ranks run the request. Load average at "
            f"the end: {load} (2 cores, shared).\n\n" + "\n".join(rows) + "\n")
    print(body)
    if not args.no_write:
        write_section("Parallel diffusion: FSDP", "benchmarks/bench_parallel.py", body)


UNEVEN_PROMPTS = {"59 tokens": "a red fox", "66 tokens": "a photo of a cat sitting on a red chair"}
"""Label -> prompt of the --uneven rows (Qwen-Image's text tokens after its template's system prompt)."""
UNEVEN_CONFIGS = {"1 rank": dict(num_devices=1), "Ulysses 2": dict(num_devices=2, ulysses_degree=2),
                  "ring 2": dict(num_devices=2, ring_degree=2)}


def text_tokens(model: str, prompt: str) -> int:
    """The text tokens Qwen-Image's transformer sees for `prompt` (pipeline.py's template, its system
    prompt dropped)."""
    from transformers import AutoTokenizer

    from omnistage.diffusion.registry import pipeline_class

    cls = pipeline_class("QwenImagePipeline")
    tokenizer = AutoTokenizer.from_pretrained(Path(zoo_path(model)) / "tokenizer")
    return len(tokenizer(cls.prompt_template.format(prompt))["input_ids"]) - cls.prompt_template_start_idx


def uneven_main(args: argparse.Namespace) -> None:
    model = "qwen-image"
    for label, prompt in UNEVEN_PROMPTS.items():
        assert f"{text_tokens(model, prompt)} tokens" == label, (label, text_tokens(model, prompt))
    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    engines = {name: start_engine(model, config) for name, config in UNEVEN_CONFIGS.items()}
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for i in range(args.repeats + 1):  # the first round is the warm-up
            for label, prompt in UNEVEN_PROMPTS.items():
                for name, engine in engines.items():
                    runs.setdefault((name, label), []).append(run_request(engine, model, args.steps, f"r{i}", prompt))
    finally:
        for engine in engines.values():
            engine.close()
    best = {key: min(times[1:]) for key, times in runs.items()}  # by latency; its CPU time alongside
    print(best, flush=True)
    rows = ["| prompt | 1 rank: latency, CPU | Ulysses 2: latency, CPU | Ulysses speed-up, wall (CPU) "
            "| ring 2: latency, CPU | ring speed-up, wall (CPU) |", "| --- | --- | --- | --- | --- | --- |"]
    speedup = {}
    for label in UNEVEN_PROMPTS:
        one = best[("1 rank", label)]
        cells = [f"{one[0]:.2f} s, {one[1]:.2f} s"]
        for name in ("Ulysses 2", "ring 2"):
            par = best[(name, label)]
            speedup[(name, label)] = (one[0] / par[0], one[1] / par[1])
            cells += [f"{par[0]:.2f} s, {par[1]:.2f} s",
                      f"{speedup[(name, label)][0]:.2f}x ({speedup[(name, label)][1]:.2f}x)"]
        rows.append(f"| {label} (\"{UNEVEN_PROMPTS[label]}\") | " + " | ".join(cells) + " |")
    ratios = [f"{name}: {speedup[(name, '59 tokens')][0] / speedup[(name, '66 tokens')][0]:.2f} wall "
              f"({speedup[(name, '59 tokens')][1] / speedup[(name, '66 tokens')][1]:.2f} CPU)"
              for name in ("Ulysses 2", "ring 2")]
    load_after = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    body = (f"Qwen-Image small (256x256: 256 image tokens), one request at a time, {args.steps} steps, CFG with the "
            f"zoo's negative prompt, fp32, CPU, `executor: mp`, one torch thread per rank; the three engines "
            f"started together and their requests alternated; best latency of {args.repeats} timed requests per "
            f"cell after a warm-up, with that request's CPU time (user + system of the engines and their rank "
            f"processes; the CPU ratio is 1 rank's over both ranks' together, so 0.5x is two ranks doing one's work without "
            f"overhead); engine start not counted. Load average {load_before} before, {load_after} after "
            f"(2 cores, shared).\n\n" + "\n".join(rows) + "\n\nSpeed-up of the 59-token prompt / the 66-token "
            "one (goal >= 0.9): " + "; ".join(ratios) + ".\n")
    print(body)
    if not args.no_write:
        write_section("Parallel diffusion: uneven prompts", "benchmarks/bench_parallel.py", body)


CACHED_MODELS = {  # zoo name -> (TeaCache's rel_l1_thresh computing about half of one rank's forwards, call changes)
    "flux": (0.3, {"true_cfg_scale": 2.0}),  # FLUX guides only with true CFG (the zoo call has a negative prompt)
    "flux2": (0.1, {}),  # guidance-distilled: one forward a step
    "sd3": (0.1, {}),
    "wan-t2v": (0.1, {}),
}
ULYSSES_2 = dict(num_devices=2, ulysses_degree=2)


def cached_configs(threshold: float) -> dict[str, dict]:
    cache = dict(cache_backend="tea_cache", cache_config={"rel_l1_thresh": threshold})
    return {"Ulysses 2": ULYSSES_2, "Ulysses 2, cached": {**ULYSSES_2, **cache}, "1 rank, cached": cache}


def output_array(out):
    """A finished output's image or video as floats in [0, 1]."""
    import numpy as np

    payload = out.payload
    pixels = payload.frames if hasattr(payload, "frames") else np.stack([np.asarray(i) for i in payload.images])
    return pixels.astype(np.float64) / 255


def psnr(a, b) -> float:
    import numpy as np

    mse = float(np.mean((a - b) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def cached_row(model: str, args: argparse.Namespace) -> tuple[str, dict]:
    threshold, overrides = CACHED_MODELS[model]
    engines = {name: start_engine(model, config) for name, config in cached_configs(threshold).items()}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    outs: dict[str, list] = {name: [] for name in engines}
    try:
        for i in range(args.repeats + 1):  # the first round is the warm-up
            for name, engine in engines.items():
                runs[name].append(run_request(engine, model, args.steps, f"r{i}", finished=outs[name], **overrides))
    finally:
        for engine in engines.values():
            engine.close()
    median = {name: (statistics.median(t[0] for t in times[1:]), statistics.median(t[1] for t in times[1:]))
              for name, times in runs.items()}
    last = {name: out[-1] for name, out in outs.items()}
    forwards = {name: (int(o.metrics.get("num_forwards_computed", 0)),
                       int(o.metrics.get("num_forwards_computed", 0) + o.metrics.get("num_forwards_skipped", 0)))
                for name, o in last.items()}
    quality = psnr(output_array(last["Ulysses 2, cached"]), output_array(last["1 rank, cached"]))
    plain, cached = median["Ulysses 2"], median["Ulysses 2, cached"]
    side = MODELS[model]
    row = (f"| {model} small ({side} px{', 9 frames' if model == 'wan-t2v' else ''}), rel_l1_thresh {threshold} "
           f"| {plain[1]:.2f} s ({plain[0]:.2f} s) | {cached[1]:.2f} s ({cached[0]:.2f} s) "
           f"| {plain[1] / cached[1]:.2f}x ({plain[0] / cached[0]:.2f}x) "
           f"| {forwards['Ulysses 2, cached'][0]} / {forwards['Ulysses 2, cached'][1]} "
           f"| {forwards['1 rank, cached'][0]} / {forwards['1 rank, cached'][1]} | {quality:.1f} dB |")
    return row, {"median": median, "forwards": forwards, "psnr": quality}


def cached_main(args: argparse.Namespace) -> None:
    models = args.models or list(CACHED_MODELS)
    rows = ["| model, TeaCache | Ulysses 2 uncached: CPU (latency) | Ulysses 2 cached: CPU (latency) "
            "| cache speed-up, CPU (latency) | forwards computed, 2 ranks cached | forwards computed, 1 rank cached "
            "| PSNR, 2 ranks cached vs 1 rank cached |", "| --- | --- | --- | --- | --- | --- | --- |"]
    loads = []
    for model in models:
        load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        row, raw = cached_row(model, args)
        print(model, raw, flush=True)
        rows.append(row[:-1] + f"| {load_before} |")
        loads.append(load_before)
    rows[0] += " load (1, 5, 15 min) before the row |"
    rows[1] += " --- |"
    body = (f"One request at a time, {args.steps} steps, CFG where the family guides (FLUX: true CFG with a negative "
            f"prompt), fp32, CPU, `executor: mp`, one torch thread per rank; per model the three engines (Ulysses 2 "
            f"uncached, Ulysses 2 cached, 1 rank cached) started together and their requests alternated; median of "
            f"{args.repeats} timed requests per cell after a warm-up: process CPU time (user + system of the engines "
            f"and their rank processes), and latency in brackets; engine start not counted. Forwards: one per CFG "
            f"branch per step. PSNR of the last timed request's output (same seed) against one rank's with the same "
            f"cache (inf: identical pixels).\n\n" + "\n".join(rows) + "\n")
    print(body)
    if not args.no_write:
        write_section("Parallel diffusion: step caches under Ulysses", "benchmarks/bench_parallel.py", body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--models", nargs="+")
    parser.add_argument("--tensor-parallel", action="store_true", help="TP 2 against 1 rank (TP_MODELS)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--fsdp", action="store_true", help="only the FSDP rows (their own section)")
    parser.add_argument("--uneven", action="store_true",
                        help="only Ulysses and ring on a 59- and a 66-token prompt (their own section)")
    parser.add_argument("--cached", action="store_true",
                        help="only TeaCache under Ulysses 2 against Ulysses 2 uncached (their own section)")
    args = parser.parse_args()
    if args.cached:
        return cached_main(args)
    if args.fsdp:
        return fsdp_main(args)
    if args.uneven:
        return uneven_main(args)
    if args.tensor_parallel:
        args.models = args.models or list(TP_MODELS)
        args.load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
        body = tensor_parallel_section(args)
        print(body)
        if not args.no_write:
            write_section("Parallel diffusion: tensor parallel", "benchmarks/bench_parallel.py", body)
        return
    args.models = args.models or ["qwen-image", "wan-t2v"]

    rows = ["| model | 1 rank x 1 thread (s) | CFG parallel, 2 ranks (s) | CFG speed-up — goal >= 1.6x "
            "| Ulysses 2, 2 ranks (s) | Ulysses speed-up — goal >= 1.4x (Wan) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for model in args.models:
        t = {name: time_engine(model, config, args.steps, args.repeats) for name, config in CONFIGS.items()}
        print(model, t, flush=True)
        rows.append(f"| {model} small ({MODELS[model]} px{', 9 frames' if model == 'wan-t2v' else ''}) "
                    f"| {t['1 rank']:.2f} | {t['CFG parallel']:.2f} | {t['1 rank'] / t['CFG parallel']:.2f}x "
                    f"| {t['Ulysses 2']:.2f} | {t['1 rank'] / t['Ulysses 2']:.2f}x |")

    vae_rows = ["| VAE decode | output | untiled: RSS growth, time | tiled: RSS growth, time "
                "| memory ratio — goal <= 0.5x | time ratio |", "| --- | --- | --- | --- | --- | --- |"]
    for model in args.models:
        whole, tiled = vae_decode(model, tiled=False), vae_decode(model, tiled=True)
        print(model, "vae", whole, tiled, flush=True)
        vae_rows.append(f"| {model} small | {'x'.join(map(str, whole['shape'][2:]))} "
                        f"| {whole['growth_mib']:.0f} MiB, {whole['seconds']:.2f} s "
                        f"| {tiled['growth_mib']:.0f} MiB, {tiled['seconds']:.2f} s "
                        f"| {tiled['growth_mib'] / whole['growth_mib']:.2f}x | {tiled['seconds'] / whole['seconds']:.2f}x |")

    body = (f"One request at a time, {args.steps} steps, fp32, CPU, `executor: mp`, one torch thread per rank, "
            f"best of {args.repeats} timed requests after a warm-up; engine start not counted.\n\n"
            + "\n".join(rows) + "\n\nVAE decode alone, fresh process per cell, random latents, one thread "
            "(frames x height x width of the output):\n\n" + "\n".join(vae_rows) + "\n")
    print(body)
    if not args.no_write:
        write_section("Parallel diffusion", "benchmarks/bench_parallel.py", body)


if __name__ == "__main__":
    main()
