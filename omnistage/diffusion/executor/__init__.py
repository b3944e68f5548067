"""Executors: `uni` (in-process), `mp` (one process per device) and `ray` (one Ray actor per
device), chosen by name."""

from omnistage.diffusion.executor.base import Executor, WorkerDiedError, get_executor_class

__all__ = ["Executor", "WorkerDiedError", "get_executor_class"]
