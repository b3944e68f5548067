"""Executors: `uni` (in-process) and `mp` (one process per device), chosen by name."""

from omnistage.diffusion.executor.base import Executor, WorkerDiedError, get_executor_class

__all__ = ["Executor", "WorkerDiedError", "get_executor_class"]
