"""A worker owns one device: it sets the device up, joins the stage's torch.distributed
group, loads the pipeline there and hands batches to its runner.

Executors call workers only through `collective_rpc(method, ...)`, so every public method
here is an RPC. What ranks do today: every rank loads the same pipeline and runs the same
batch (a data-parallel duplicate); rank 0's result is the one returned and the other
ranks answer `None`. The group is live (checked by an all_reduce at start-up) so the
parallel features (CFG / sequence / VAE patch parallel) can split the work later.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.device import canonical_device, device_scope, resolve_dtype
from omnistage.core.parking import Parked, return_freed_memory, torch_modules
from omnistage.core.weights import NO_FOLDER, Dropped, checkpoint_names, load_weights, read_checkpoint, weights_folder
from omnistage.diffusion.runner import DiffusionRunner, ProgressSink
from omnistage.diffusion.sched.output import RunnerOutput, SchedulerOutput

@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs to start, picklable for spawned processes."""

    model_path: str
    pipeline_cls: type
    devices: tuple[str, ...]
    stage: StageDeployConfig

    @property
    def world_size(self) -> int:
        return len(self.devices)


class DiffusionWorker:
    def __init__(self, config: WorkerConfig, rank: int = 0):
        self.config = config
        self.rank = rank
        self.device = canonical_device(config.devices[rank])
        self.dtype = resolve_dtype(config.stage.dtype, self.device)
        self.runner: DiffusionRunner | None = None
        self._parked: Parked | None = None  # the pipeline's weights, while the stage sleeps
        self._dropped: Dropped | None = None  # the weights freed by sleep level 2
        self._weights_path = weights_folder(config.model_path)  # where sleep level 2 reads them back

    # -- start-up ------------------------------------------------------------------------

    def init_device(self) -> None:
        """No `torch.cuda.set_device`: an in-process worker shares its process with other stages'
        devices, so every call that touches the device runs in `device_scope(self.device)`."""
        if self.device.type != "cuda" and self.config.world_size > 1:
            # CPU ranks share the machine's cores; without a split each would claim them all.
            num_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            torch.set_num_threads(max(1, num_cpus // self.config.world_size))

    def init_distributed(self, store_host: str, store_port: int) -> None:
        """Join the stage's group through the executor's TCPStore (bound to a free port).
        gloo on CPU, nccl on CUDA."""
        import torch.distributed as dist

        world_size = self.config.world_size
        store = dist.TCPStore(store_host, store_port, None, is_master=False)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        with device_scope(self.device):
            dist.init_process_group(backend, store=store, rank=self.rank, world_size=world_size,
                                    device_id=self.device if backend == "nccl" else None)
            check = torch.ones(1, device=self.device)
            dist.all_reduce(check)
        if int(check.item()) != world_size:
            raise RuntimeError(f"all_reduce check gave {check.item()}, expected {world_size}")

    def load_model(self) -> None:
        with device_scope(self.device):
            pipeline = self.config.pipeline_cls.from_pretrained(self.config.model_path, device=self.device,
                                                                dtype=self.dtype, deploy=self.config.stage)
        self.runner = DiffusionRunner(pipeline)

    # -- RPCs ----------------------------------------------------------------------------

    def execute_model(self, batch: SchedulerOutput, on_progress: ProgressSink | None = None) -> RunnerOutput | None:
        with device_scope(self.device):
            output = self.runner.execute(batch, on_progress)
        return output if self.rank == 0 else None

    def get_pid(self) -> int:
        return os.getpid()

    def sleep(self, level: int) -> int:
        if self._parked is not None:
            return 0  # asleep already
        freed = 0
        if level == 2:
            if self._weights_path is None:
                raise RuntimeError(NO_FOLDER)
            self._dropped = Dropped(self._modules(), checkpoint_names(self._weights_path, self._modules()))
            freed = self._dropped.num_bytes
        self._parked = Parked(torch_modules(self.runner.pipeline.components))
        return_freed_memory()
        return freed + self._parked.num_bytes

    def wake_up(self) -> None:
        if self._parked is not None:
            self._parked.restore()
            self._parked = None
        if self._dropped is not None:
            with device_scope(self.device):
                self._dropped.restore(self._modules(), read_checkpoint(self._weights_path, self._modules()))
            self._dropped = None

    def update_weights(self, path: str | None, tensors: dict | None) -> int:
        if self._dropped is not None:
            raise RuntimeError("update_weights: the stage sleeps at level 2 (its weights are dropped); wake it up first")
        new = read_checkpoint(path, self._modules()) if path is not None else tensors
        with device_scope(self.device):
            num = load_weights(self._modules(), new)
        self._weights_path = path
        return num

    def load_lora(self, name: str, path: str) -> str | None:
        """Load LoRA adapter `name` from `path` (deploy `max_loras`); why it cannot, or None. A
        reason, not an exception: it must reach the engine as the caller's mistake from every executor."""
        with device_scope(self.device):
            return self.runner.pipeline.step_runner.load(name, path)

    def unload_lora(self, name: str) -> None:
        self.runner.pipeline.step_runner.unload(name)

    def _modules(self) -> dict[str, torch.nn.Module]:
        """The pipeline's torch components by name (the subfolders of its checkpoint)."""
        return {name: c for name, c in self.runner.pipeline.components.items() if isinstance(c, torch.nn.Module)}

    def shutdown(self) -> None:
        import torch.distributed as dist

        if self.runner is not None:
            self.runner.close()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
