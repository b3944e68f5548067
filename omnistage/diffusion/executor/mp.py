"""The multiprocess executor: one spawned worker process per device.

Control: one pipe per worker carries `(method, args, kwargs, stream_progress)` down and
`("progress" | "ok" | "error", ...)` back; results travel through a shm `Channel`
(runtime/channel.py), processes are spawned and stopped by runtime/process.py.
The ranks form a torch.distributed group (gloo on CPU, nccl on CUDA) through a TCPStore
that this process hosts on a free port (bound to port 0).

Failure: while waiting, the executor watches every worker's process sentinel. A worker
that dies fails the call in flight with `WorkerDiedError` at once, and the executor stays
unhealthy. `close()` stops the workers (gracefully, then terminate, then kill) and
unlinks any shared-memory segment they left.
"""

from __future__ import annotations

import os
import secrets
import threading
import weakref
from multiprocessing.connection import Connection, wait
from typing import Any

from omnistage.diffusion.executor.base import Executor
from omnistage.diffusion.runner import ProgressSink, error_message
from omnistage.diffusion.worker import DiffusionWorker, WorkerConfig
from omnistage.runtime import process
from omnistage.runtime.channel import Channel, sweep_shm, unpack
from omnistage.runtime.process import WorkerDiedError

STORE_HOST = "127.0.0.1"


def worker_main(config: WorkerConfig, rank: int, store_port: int, conn: Connection, shm_prefix: str) -> None:
    """Body of a worker process: start up, then serve RPCs until shutdown or the pipe closes."""
    process.prepare_child()
    # The stage's `env` (process plumbing such as NCCL_* settings), before any group starts.
    os.environ.update(config.stage.env)
    channel = Channel("shm", f"{shm_prefix}r{rank}_")
    try:
        worker = DiffusionWorker(config, rank)
        worker.init_device()
        if config.world_size > 1:
            worker.init_distributed(STORE_HOST, store_port)
        worker.load_model()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", (type(exc).__name__, error_message(exc))))
        return
    conn.send(("ok", channel.put(os.getpid())))
    while True:
        try:
            method, args, kwargs, stream = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        if stream:
            kwargs["on_progress"] = lambda events: conn.send(("progress", channel.put(events)))
        try:
            result = getattr(worker, method)(*args, **kwargs)
            conn.send(("ok", channel.put(result)))
        except Exception as exc:  # noqa: BLE001
            conn.send(("error", (type(exc).__name__, error_message(exc))))
        if method == "shutdown":
            break


def _stop(procs: list[Any], conns: list[Connection], shm_prefix: str, graceful: bool) -> None:
    """Stop the workers and remove what they leave. Safe to call twice."""
    if graceful:
        for conn in conns:
            try:
                conn.send(("shutdown", (), {}, False))
            except (OSError, ValueError):
                pass
    process.stop(procs, timeout_s=5 if graceful else 0)
    for conn in conns:
        conn.close()
    sweep_shm(shm_prefix)


class MultiprocExecutor(Executor):
    def __init__(self, config: WorkerConfig):
        import torch.distributed as dist

        super().__init__(config)
        # Workers join the group through this store; port 0 = any free port, no races.
        self._store = dist.TCPStore(STORE_HOST, 0, None, True) if config.world_size > 1 else None
        store_port = self._store.port if self._store is not None else 0
        self.shm_prefix = f"omnistage_{os.getpid()}_{secrets.token_hex(4)}_"
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self._lock = threading.Lock()  # one call in flight on the pipes
        self._dead: str | None = None
        self._crashed = False
        for rank in range(config.world_size):
            parent_conn, child_conn = process.pipe()
            proc = process.spawn(worker_main, (config, rank, store_port, child_conn, self.shm_prefix),
                                 name=f"omnistage-rank-{rank}", daemon=True)
            child_conn.close()
            self.procs.append(proc)
            self.conns.append(parent_conn)
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.conns, self.shm_prefix, False)
        try:
            with self._lock:
                self.pids = self._gather(set(range(config.world_size)), None)
        except BaseException:
            self.close()
            raise

    # -- calls ---------------------------------------------------------------------------

    def collective_rpc(self, method: str, *args: Any, unique_reply_rank: int | None = None,
                       on_progress: ProgressSink | None = None, **kwargs: Any) -> Any:
        with self._lock:
            self._check_alive()
            for rank, conn in enumerate(self.conns):
                try:
                    conn.send((method, args, kwargs, on_progress is not None and rank == 0))
                except (OSError, ValueError):
                    self._raise_dead(rank)
            results = self._gather(set(range(len(self.conns))), on_progress)
        return results[unique_reply_rank] if unique_reply_rank is not None else results

    def _gather(self, pending: set[int], on_progress: ProgressSink | None) -> list[Any]:
        """Wait for one reply from each pending rank, passing progress on; a dead worker
        raises WorkerDiedError as soon as its sentinel fires."""
        results: list[Any] = [None] * len(self.conns)
        errors: dict[int, tuple[str, str]] = {}
        sentinels = {proc.sentinel: rank for rank, proc in enumerate(self.procs)}
        conns = {id(conn): rank for rank, conn in enumerate(self.conns)}
        while pending:
            ready = wait([self.conns[r] for r in pending] + list(sentinels))
            for obj in ready:
                if isinstance(obj, Connection):
                    rank = conns[id(obj)]
                    try:
                        kind, value = obj.recv()
                    except (EOFError, OSError):
                        self._raise_dead(rank)
                    if kind == "progress":
                        if on_progress is not None:
                            on_progress(unpack(value))
                        continue
                    pending.discard(rank)
                    if kind == "ok":
                        results[rank] = unpack(value)
                    else:
                        errors[rank] = value
                elif not self.conns[sentinels[obj]].poll():  # died with nothing left to read
                    self._raise_dead(sentinels[obj])
        if errors:
            rank = min(errors)
            _, message = errors[rank]
            raise RuntimeError(f"diffusion worker rank {rank} failed: {message}")
        return results

    # -- health --------------------------------------------------------------------------

    def _raise_dead(self, rank: int) -> None:
        proc = self.procs[rank]
        how, self._crashed = process.describe_exit(proc)
        self._dead = f"diffusion worker rank {rank} (pid {proc.pid}) died ({how})"
        raise WorkerDiedError(self._dead, self._crashed)

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise WorkerDiedError(self._dead, self._crashed)
        for rank, proc in enumerate(self.procs):
            if not proc.is_alive():
                self._raise_dead(rank)

    def is_healthy(self) -> bool:
        if self._dead is None and not all(p.is_alive() for p in self.procs):
            self._dead = "a diffusion worker process died"
        return self._dead is None

    def close(self) -> None:
        if not self._finalizer.alive:
            return
        graceful = self._dead is None and self._lock.acquire(timeout=1)
        try:
            self._finalizer.detach()
            _stop(self.procs, self.conns, self.shm_prefix, graceful)
        finally:
            if graceful:
                self._lock.release()
            self._dead = self._dead or "executor closed"
            self._store = None
