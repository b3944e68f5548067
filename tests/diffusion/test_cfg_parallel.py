"""CFG parallel on two CPU ranks (gloo): the cond and uncond branches run on different ranks
and the output equals one rank's, for a family of each guidance shape (split calls with
true CFG: Qwen-Image, FLUX.2-klein; split with two guidance scales: Wan; split with the guider's rule:
HunyuanVideo-1.5; one batched call: SD3, Z-Image)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.registry import pipeline_class
from omnistage.testing import call_kwargs as zoo_call_kwargs

from two_ranks import run_two_ranks
from parity import request_for

FAMILIES = {  # zoo name -> diffusers class name
    "qwen-image": "QwenImagePipeline",
    "wan-t2v": "WanPipeline",
    "sd3": "StableDiffusion3Pipeline",
    "z-image": "ZImagePipeline",
    "flux2-klein": "Flux2KleinPipeline",
    "hunyuan-video": "HunyuanVideo15Pipeline",
}
TOLERANCE = 1e-4


def call_kwargs(name: str) -> dict:
    call = dict(zoo_call_kwargs(name), num_inference_steps=3)
    if name == "wan-t2v":
        call.update(guidance_scale=4.0)
    return call


def run(name: str, path: str, deploy: StageDeployConfig | None = None) -> np.ndarray:
    pipeline = pipeline_class(FAMILIES[name]).from_pretrained(path, deploy=deploy)
    assert pipeline.accelerations == (["cfg_parallel"] if deploy is not None else [])
    (arr,) = pipeline.decode_arrays(pipeline.denoise([request_for(call_kwargs(name), seed=4)]))
    return arr


def _rank_main(rank: int, port: int, paths: dict[str, str], out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    deploy = StageDeployConfig(executor="mp", num_devices=2, cfg_parallel_size=2)
    for name, path in paths.items():
        arr = run(name, path, deploy)
        if rank == 0:
            np.save(os.path.join(out_dir, f"{name}.npy"), arr)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_outputs(zoo, tmp_path_factory):
    paths = {name: str(zoo(name)) for name in FAMILIES}
    out_dir = str(tmp_path_factory.mktemp("cfg_parallel"))
    run_two_ranks(_rank_main, paths, out_dir, timeout=300)
    return {name: np.load(os.path.join(out_dir, f"{name}.npy")) for name in FAMILIES}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_cfg_parallel_equals_one_rank(zoo, one_thread, two_rank_outputs, name):
    assert np.abs(two_rank_outputs[name] - run(name, str(zoo(name)))).max() <= TOLERANCE


def test_cfg_parallel_is_refused_without_two_ranks(zoo):
    deploy = StageDeployConfig(executor="mp", num_devices=2, cfg_parallel_size=2)
    with pytest.raises(ValueError, match="cfg_parallel_size=2 needs executor 'mp' with num_devices=2"):
        pipeline_class("ZImagePipeline").from_pretrained(str(zoo("z-image")), deploy=deploy)
