"""The in-process executor: one worker on one device, called directly."""

from __future__ import annotations

from typing import Any

from omnistage.diffusion.executor.base import Executor
from omnistage.diffusion.runner import ProgressSink
from omnistage.diffusion.worker import DiffusionWorker, WorkerConfig


class UniExecutor(Executor):
    def __init__(self, config: WorkerConfig):
        if config.world_size != 1:
            raise ValueError(f"executor 'uni' runs one device in this process, got num_devices="
                             f"{config.world_size}; use executor 'mp'")
        super().__init__(config)
        self.worker = DiffusionWorker(config, rank=0)
        self.worker.init_device()
        self.worker.load_model()

    def collective_rpc(self, method: str, *args: Any, unique_reply_rank: int | None = None,
                       on_progress: ProgressSink | None = None, **kwargs: Any) -> Any:
        if on_progress is not None:
            kwargs["on_progress"] = on_progress
        result = getattr(self.worker, method)(*args, **kwargs)
        return result if unique_reply_rank is not None else [result]

    def is_healthy(self) -> bool:
        return True

    def close(self) -> None:
        self.worker.shutdown()
