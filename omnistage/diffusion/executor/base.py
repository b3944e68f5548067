"""Executors run scheduler batches on the stage's workers. They are chosen by name
(`uni` in-process, `mp` one process per device, `ray` one Ray actor per device) and every worker call goes
through one `collective_rpc(method, *args)`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from omnistage.core.registry import import_target
from omnistage.diffusion.runner import ProgressSink
from omnistage.diffusion.sched.output import RunnerOutput, SchedulerOutput
from omnistage.diffusion.worker import WorkerConfig
from omnistage.runtime.process import WorkerDiedError

EXECUTORS = {
    "uni": "omnistage.diffusion.executor.uni:UniExecutor",
    "mp": "omnistage.diffusion.executor.mp:MultiprocExecutor",
    "ray": "omnistage.diffusion.executor.ray:RayExecutor",
}


def get_executor_class(name: str) -> type["Executor"]:
    if name not in EXECUTORS:
        raise ValueError(f"executor must be one of {list(EXECUTORS)}, got {name!r}")
    return import_target(EXECUTORS[name])


class Executor(ABC):
    def __init__(self, config: WorkerConfig):
        self.config = config

    @abstractmethod
    def collective_rpc(self, method: str, *args: Any, unique_reply_rank: int | None = None,
                       on_progress: ProgressSink | None = None, **kwargs: Any) -> Any:
        """Call `method` on every worker; return every rank's result, or only
        `unique_reply_rank`'s. `on_progress` is handed to rank 0's method."""

    def execute(self, batch: SchedulerOutput, on_progress: ProgressSink | None = None) -> RunnerOutput:
        return self.collective_rpc("execute_model", batch, unique_reply_rank=0, on_progress=on_progress)

    def worker_pids(self) -> list[int]:
        return self.collective_rpc("get_pid")

    @abstractmethod
    def is_healthy(self) -> bool: ...

    @abstractmethod
    def close(self) -> None: ...
