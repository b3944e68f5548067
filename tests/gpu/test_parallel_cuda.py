"""Parallel diffusion over nccl: the CPU suite's equality checks (tests/diffusion/
test_sequence_parallel.py, test_declared_accelerations.py, test_vae_patch_parallel.py) on two CUDA
ranks, one GPU each, fp32: Ulysses 2 (Z-Image, Wan, Qwen-Image, FLUX, SD3), ring 2 (Z-Image, Wan,
Qwen-Image)
and CFG parallel 2 with VAE patch parallel 2 (Z-Image, Wan) against one rank on cuda:0.
NCCL takes one GPU per rank, so this needs two devices and skips on one."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu

CASES = [  # (zoo name, diffusers class, deploy degrees)
    ("z-image", "ZImagePipeline", dict(ulysses_degree=2)),
    ("wan-t2v", "WanPipeline", dict(ulysses_degree=2)),
    ("qwen-image", "QwenImagePipeline", dict(ulysses_degree=2)),
    ("flux", "FluxPipeline", dict(ulysses_degree=2)),
    ("z-image", "ZImagePipeline", dict(ring_degree=2)),
    ("wan-t2v", "WanPipeline", dict(ring_degree=2)),
    ("qwen-image", "QwenImagePipeline", dict(ring_degree=2)),
    ("sd3", "StableDiffusion3Pipeline", dict(ulysses_degree=2)),  # 141 text tokens: padded and masked
    ("z-image", "ZImagePipeline", dict(cfg_parallel_size=2, vae_patch_parallel_size=2)),
    ("wan-t2v", "WanPipeline", dict(cfg_parallel_size=2, vae_patch_parallel_size=2)),
]
TOLERANCE = 1e-3


def generate(name: str, cls: str, path: str, device: str, degrees: dict | None) -> np.ndarray:
    from parity import request_for

    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.registry import pipeline_class
    from omnistage.testing import call_kwargs as zoo_call_kwargs

    deploy = StageDeployConfig(executor="mp", num_devices=2, **degrees) if degrees else None
    pipeline = pipeline_class(cls).from_pretrained(path, device=device, deploy=deploy)
    call = {**zoo_call_kwargs(name), "num_inference_steps": 2}
    (arr,) = pipeline.decode_arrays(pipeline.denoise([request_for(call, seed=4)]))
    return arr


def _rank_main(rank: int, port: int, paths: dict[str, str], out_dir: str) -> None:
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                           device_id=torch.device("cuda", rank))
    results = [generate(name, cls, paths[name], f"cuda:{rank}", degrees) for name, cls, degrees in CASES]
    if rank == 0:
        torch.save(results, os.path.join(out_dir, "results.pt"))
    dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="nccl needs one GPU per rank: two CUDA devices")
def test_parallel_degrees_over_nccl_equal_one_rank(zoo, tmp_path):
    paths = {name: str(zoo(name)) for name, _, _ in CASES}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(rank, port, paths, str(tmp_path))) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0
    results = torch.load(tmp_path / "results.pt", weights_only=False)
    for (name, cls, degrees), arr in zip(CASES, results):
        diff = np.abs(arr - generate(name, cls, paths[name], "cuda:0", None)).max()
        assert diff <= TOLERANCE, (name, degrees, diff)
