"""Child processes, written once: spawn, stop, describe how one ended.

Stage processes (`runtime: process`) and diffusion worker processes (`executor: mp`) are
started, stopped and reported on by these functions; what they leave in shared memory
is swept with `channel.sweep_shm`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

STOP_TIMEOUT_S = 10.0

# Children start from a fork server: one clean interpreter per parent that imports what every
# stage and worker needs once (~10 s of CPU for torch, transformers, diffusers and the engines),
# then forks a child per start, which begins with those modules loaded. A spawned child would
# import them all again. Where there is no fork (Windows), children are spawned.
_PRELOAD = ["__main__", "torch", "transformers", "diffusers", "omnistage.runtime.endpoint",
            "omnistage.diffusion.executor.mp", "omnistage.diffusion.engine", "omnistage.ar.engine",
            "omnistage.generation.engine"]
_CONTEXT = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")


def preload(*modules: str) -> None:
    """Have the fork server import `modules` too when it starts (no effect once it runs, or
    where children are spawned)."""
    _PRELOAD.extend(m for m in modules if m not in _PRELOAD)
    if _CONTEXT.get_start_method() == "forkserver":
        _CONTEXT.set_forkserver_preload(list(_PRELOAD))


def context() -> Any:
    """The multiprocessing context every child of this package starts from."""
    return _CONTEXT


preload()

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


def spawn(target: Callable[..., Any], args: tuple, name: str, daemon: bool = False,
          preloaded: bool = True) -> mp.Process:
    """Start `target(*args)` in a new process (not a fork of this one, so a script that starts
    one needs the `if __name__ == "__main__":` guard). The child sees this process's
    environment as it is now, as a spawned child would, not the fork server's. `preloaded=False`
    spawns a bare interpreter instead of forking the fork server: for a light child (an API
    server process needs no torch) in a process that may start no other, where the server's
    imports would cost more than the child's own."""
    context = _CONTEXT if preloaded else mp.get_context("spawn")
    proc = context.Process(target=_child_main, args=(dict(os.environ), name, target, args),
                           name=name, daemon=daemon)
    proc.start()
    return proc


def process_title(name: str) -> str:
    """What `ps`, `top` and psutil's name() show for the child called `name` (Linux keeps 15
    bytes): "omnistage-stage-thinker" shows as "omni:stage-thin"."""
    return ("omni:" + name.removeprefix("omnistage-"))[:15]


def _child_main(environ: dict[str, str], name: str, target: Callable[..., Any], args: tuple) -> Any:
    os.environ.clear()
    os.environ.update(environ)
    _set_title(process_title(name))
    return target(*args)


def _set_title(title: str) -> None:
    if sys.platform == "linux":  # elsewhere the child keeps its interpreter's name
        import ctypes

        PR_SET_NAME = 15
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, title.encode()[:15], 0, 0, 0)


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
    return _CONTEXT.Pipe(duplex=duplex)


def queue() -> Any:
    return _CONTEXT.Queue()


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
