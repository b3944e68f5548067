"""The diffusion executors on one CUDA device: `mp` (a spawned worker process that sets its
own CUDA device) gives the same image as `uni` (in-process), and a worker joins an nccl
group of one and passes the group's all_reduce check (`DiffusionWorker.init_distributed`).

One GPU cannot hold an nccl group of two (nccl refuses two ranks on one device), so the mp
executor, which starts a group only for two ranks or more, is compared for its process
and device plumbing, and the nccl path is exercised directly with a group of one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.types import StageRequest
from omnistage.diffusion.params import DiffusionParams

pytestmark = pytest.mark.gpu

PARAMS = dict(num_inference_steps=2, height=32, width=32)


def images(path: str, **config) -> list[np.ndarray]:
    """Two requests through a DiffusionEngine on cuda:0 in fp32, as uint8 arrays."""
    from omnistage.diffusion.engine import DiffusionEngine

    config = StageDeployConfig(devices=("cuda:0",), dtype="float32", max_num_seqs=2, **config)
    done = {}
    with DiffusionEngine(path, config=config) as engine:
        for i, prompt in enumerate(["a cat", "a tree in the snow at night"]):
            engine.add_request(StageRequest(f"r{i}", prompt, DiffusionParams(seed=i, **PARAMS)))
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    assert out.error is None, out.error
                    done[out.request_id] = np.asarray(out.payload.images[0])
    return [done["r0"], done["r1"]]


@pytest.fixture(scope="module")
def path(zoo) -> str:
    return str(zoo("z-image"))


def test_mp_executor_on_cuda_gives_the_uni_image(path):
    uni = images(path, executor="uni")
    mp = images(path, executor="mp")
    for a, b in zip(uni, mp):
        assert a.shape == (32, 32, 3)
        # Same kernels on the same device in another process: equal, up to one level of rounding.
        assert np.abs(a.astype(np.int16) - b.astype(np.int16)).max() <= 1


def test_worker_joins_an_nccl_group_of_one(path):
    import torch.distributed as dist

    from omnistage.models.z_image.pipeline import ZImage
    from omnistage.diffusion.worker import DiffusionWorker, WorkerConfig

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    store = dist.TCPStore("127.0.0.1", 0, None, True)  # the executor's side of the store
    config = WorkerConfig(path, ZImage, ("cuda:0",), StageDeployConfig(devices=("cuda:0",)))
    worker = DiffusionWorker(config, rank=0)
    assert worker.dtype == torch.bfloat16  # dtype: auto on CUDA
    try:
        worker.init_device()
        worker.init_distributed("127.0.0.1", store.port)  # nccl, then an all_reduce check
        assert dist.get_backend() == "nccl" and dist.get_world_size() == 1
    finally:
        worker.shutdown()
    assert not dist.is_initialized()
