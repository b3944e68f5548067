"""Child processes, written once: spawn, stop, describe how one ended.

Stage processes (`runtime: process`) and diffusion worker processes (`executor: mp`) are
started, stopped and reported on by these functions; what they leave in shared memory
is swept with `channel.sweep_shm`.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import sys
from collections.abc import Callable
from typing import Any

STOP_TIMEOUT_S = 10.0

# Signals that come from outside (the OOM killer, an operator, our own stop), not from
# the process's own work: a death by one of them blames no request.
_EXTERNAL_SIGNALS = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class WorkerDiedError(RuntimeError):
    """A process (or Ray actor) behind an engine is gone; the engine cannot serve any more.

    `crashed` is True when it died of its own work (an exit code, a fatal signal such as
    SIGSEGV, a panic), so the requests it was running may be the cause; False when it was
    killed from outside or stopped answering."""

    def __init__(self, message: str, crashed: bool = False):
        super().__init__(message)
        self.crashed = crashed

    def __reduce__(self):  # picklable across stage processes
        return type(self), (str(self), self.crashed)


def spawn(target: Callable[..., Any], args: tuple, name: str, daemon: bool = False) -> mp.Process:
    """Start `target(*args)` in a spawned process (spawned, so a script that starts one
    needs the `if __name__ == "__main__":` guard)."""
    proc = mp.get_context("spawn").Process(target=target, args=args, name=name, daemon=daemon)
    proc.start()
    return proc


def prepare_child() -> None:
    """First thing in a spawned child: leave nothing behind when killed, unwind when terminated."""
    import threading

    from tqdm import tqdm

    # tqdm's default lock is a named multiprocessing semaphore in /dev/shm; a killed child
    # would leave it behind. Loading bars in a child need no cross-process lock.
    tqdm.set_lock(threading.RLock())
    # terminate() then unwinds like an exit, so process-level cleanups still run; the exit
    # code says SIGTERM the shell's way, so describe_exit blames no request for it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def pipe(duplex: bool = True) -> tuple[Any, Any]:
    return mp.get_context("spawn").Pipe(duplex=duplex)


def stop(procs: list[mp.Process], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Wait up to `timeout_s` for each process to end by itself (the caller asked it to),
    then terminate it, then kill it (a stopped process ignores SIGTERM). Safe to call twice."""
    for proc in procs:
        if proc.pid is None:
            continue
        proc.join(timeout_s)
        if proc.is_alive():
            proc.terminate()
            proc.join(min(timeout_s, 2.0))
        if proc.is_alive():
            proc.kill()
            proc.join()


def describe_exit(proc: mp.Process) -> tuple[str, bool]:
    """(how `proc` ended, whether it crashed by itself: see WorkerDiedError.crashed)."""
    proc.join(1.0)
    code = proc.exitcode
    if code is None:
        return "is still running", False
    signum = -code if code < 0 else code - 128 if code == 128 + signal.SIGTERM else None
    if signum is not None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = str(signum)
        return f"killed by signal {signum} ({name})", signum not in _EXTERNAL_SIGNALS
    return f"exit code {code}", code != 0
