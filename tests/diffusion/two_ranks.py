"""Two spawned gloo ranks on loopback, for the parallel-degree tests: each rank runs
`rank_main(rank, port, *args)`, joins the group at `tcp://127.0.0.1:port`, and writes what
the test checks to files; the parent only starts, waits and checks the exit codes."""

from __future__ import annotations

import multiprocessing as mp
import socket
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(rank_main: Callable[..., None], *args: Any, timeout: float = 400) -> None:
    port = free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(rank, port, *args)) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
        if p.is_alive():
            p.kill()
        assert p.exitcode == 0, f"rank process exited with {p.exitcode}"
