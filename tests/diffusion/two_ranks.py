"""Two spawned gloo ranks on loopback, for the parallel-degree tests: each rank runs
`rank_main(rank, port, *args)`, joins the group at `tcp://127.0.0.1:port`, and writes what
the test checks to files; the parent only starts, waits and checks that both ranks returned.

The two rank processes start once per session and run every test's `rank_main` in turn
(each on a new port, so a new process group). They are forked from omnistage's fork server
(`omnistage.runtime.process`), which has imported what a rank needs before its first pipeline
loads (torch, diffusers, the engines; `PRELOAD` and the first test module that calls too when
the pair is what starts it): those imports take ~10 s of CPU a process on the 2-core machine,
paid once instead of once per rank. A `rank_main` must destroy its process group before it
returns (all of them do); after a failure or a timeout the pair is killed and the next call
forks a fresh one. `run_ranks` does the same with more ranks (a pool per size), for degrees that
compose (cfg x tensor)."""

from __future__ import annotations

import atexit
import os
import socket
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from omnistage.runtime import process


PRELOAD = ["torch.distributed", "diffusers.models.transformers", "diffusers.models.autoencoders",
           "diffusers.models.unets"]
"""Imported by the fork server: a first `from_pretrained` imports these packages whole."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(rank: int, conn: Connection) -> None:
    """A rank process: run each (rank_main, port, args) it is sent; answer None or the traceback."""
    while True:
        try:
            job = conn.recv()
        except EOFError:  # the test process is gone
            return
        if job is None:
            return
        rank_main, port, args = job
        try:
            rank_main(rank, port, *args)
            conn.send(None)
        except BaseException:  # noqa: BLE001 - reported to the test, which fails with it
            conn.send(traceback.format_exc())


class _Ranks:
    def __init__(self, test_module: str, num_ranks: int = 2) -> None:
        # The ranks fork from omnistage's own fork server (a fresh interpreter, not a fork of this
        # process and its threads), which imports these too if it has not started yet.
        process.preload(*PRELOAD, test_module)
        ctx = process.context()
        self.conns: list[Connection] = []
        self.procs = []
        for rank in range(num_ranks):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(rank, child))
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def run(self, rank_main: Callable[..., None], args: tuple, timeout: float) -> list[str]:
        """Both ranks run `rank_main`; the problems seen (empty when both returned)."""
        port = free_port()
        for conn in self.conns:
            conn.send((rank_main, port, args))
        problems = []
        deadline = time.monotonic() + timeout
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs)):
            # After one rank failed its peer may wait in a collective until gloo's timeout: give it 10 s.
            wait = max(0.0, deadline - time.monotonic()) if not problems else 10.0
            if not conn.poll(wait):
                problems.append(f"rank {rank} did not return within {timeout} s")
                continue
            try:
                error = conn.recv()
            except EOFError:
                proc.join(5)
                problems.append(f"rank {rank} process exited with {proc.exitcode}")
                continue
            if error is not None:
                problems.append(f"rank {rank} raised:\n{error}")
        return problems

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()


_pools: dict[int, _Ranks] = {}
"""The started rank processes, by their number."""


def _close_pool(num_ranks: int) -> None:
    if (pool := _pools.pop(num_ranks, None)) is not None:
        pool.close()


atexit.register(lambda: [_close_pool(n) for n in list(_pools)])


def run_two_ranks(rank_main: Callable[..., None], *args: Any, timeout: float = 400) -> None:
    run_ranks(2, rank_main, *args, timeout=timeout)


def run_ranks(num_ranks: int, rank_main: Callable[..., None], *args: Any, timeout: float = 400) -> None:
    pool = _pools.get(num_ranks)
    if pool is None or not pool.alive():
        _close_pool(num_ranks)
        pool = _pools[num_ranks] = _Ranks(rank_main.__module__, num_ranks)
    problems = pool.run(rank_main, args, timeout)
    if problems:  # a rank may be stuck in a collective or hold its group: never reuse the pool
        for proc in pool.procs:
            proc.kill()
        _close_pool(num_ranks)
        raise AssertionError("\n".join(problems))


def save_rank_results(out_dir: str | os.PathLike, rank: int, results: Any) -> None:
    """What rank `rank` hands the test (any picklable object), in `out_dir`."""
    import torch

    torch.save(results, Path(out_dir) / f"rank{rank}.pt")


def rank_results(out_dir: str | os.PathLike, num_ranks: int = 2) -> list:
    """What each of `num_ranks` ranks saved with `save_rank_results`, by rank."""
    import torch

    return [torch.load(Path(out_dir) / f"rank{rank}.pt", weights_only=False) for rank in range(num_ranks)]
