"""CFG parallel on two CPU ranks (gloo): the cond and uncond branches run on different ranks
(each rank runs the transformer for its own branch only, counted per branch) and the output
equals one rank's, for a family of each guidance shape (split calls with
true CFG: Qwen-Image, FLUX.2-klein, Ovis-Image, Krea 2, LongCat-Image; split with two guidance scales: Wan; split with the guider's rule:
HunyuanVideo-1.5; one batched call: SD3, SDXL, ERNIE-Image, Z-Image)."""

from __future__ import annotations

import json
import os
from collections import Counter

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
    "sdxl": "StableDiffusionXLPipeline",
    "ernie-image": "ErnieImagePipeline",
    "ovis-image": "OvisImagePipeline",
    "krea2": "Krea2Pipeline",
    "longcat-image": "LongCatImagePipeline",
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


def run(name: str, path: str, deploy: StageDeployConfig | None = None) -> tuple[np.ndarray, dict[str, int]]:
    """The decoded output, and how many transformer rows of each branch ("cond", "uncond") this
    process computed."""
    pipeline = pipeline_class(FAMILIES[name]).from_pretrained(path, deploy=deploy)
    assert pipeline.accelerations == (["cfg_parallel"] if deploy is not None else [])
    branches: Counter = Counter()
    runner = pipeline.guidance_runner

    def counting_runner(states, predict, guidance):
        def spy(rows):
            branches.update(branch for _, branch in rows)
            return predict(rows)
        return runner(states, spy, guidance)

    pipeline.guidance_runner = counting_runner
    (arr,) = pipeline.decode_arrays(pipeline.denoise([request_for(call_kwargs(name), seed=4)]))
    return arr, dict(branches)


def _rank_main(rank: int, port: int, paths: dict[str, str], out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    deploy = StageDeployConfig(executor="mp", num_devices=2, cfg_parallel_size=2)
    for name, path in paths.items():
        arr, branches = run(name, path, deploy)
        if rank == 0:
            np.save(os.path.join(out_dir, f"{name}.npy"), arr)
        with open(os.path.join(out_dir, f"{name}-{rank}.json"), "w") as f:
            json.dump(branches, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_outputs(zoo, tmp_path_factory):
    paths = {name: str(zoo(name)) for name in FAMILIES}
    out_dir = str(tmp_path_factory.mktemp("cfg_parallel"))
    run_two_ranks(_rank_main, paths, out_dir, timeout=300)
    outputs = {}
    for name in FAMILIES:
        ranks = []
        for rank in range(2):
            with open(os.path.join(out_dir, f"{name}-{rank}.json")) as f:
                ranks.append(json.load(f))
        outputs[name] = np.load(os.path.join(out_dir, f"{name}.npy")), ranks
    return outputs


@pytest.mark.parametrize("name", list(FAMILIES))
def test_cfg_parallel_equals_one_rank(zoo, one_thread, two_rank_outputs, name):
    arr, (rank0, rank1) = two_rank_outputs[name]
    alone, both = run(name, str(zoo(name)))
    assert np.abs(arr - alone).max() <= TOLERANCE
    # One rank computes both branches; with CFG parallel each rank computes only its own, as many
    # rows as one rank did for that branch (so two ranks each running both would fail here).
    assert both["cond"] > 0 and both["uncond"] > 0
    assert rank0 == {"cond": both["cond"]} and rank1 == {"uncond": both["uncond"]}


def test_cfg_parallel_is_refused_without_two_ranks(zoo):
    deploy = StageDeployConfig(executor="mp", num_devices=2, cfg_parallel_size=2)
    with pytest.raises(ValueError, match="cfg_parallel_size=2 needs executor 'mp' with num_devices=2"):
        pipeline_class("ZImagePipeline").from_pretrained(str(zoo("z-image")), deploy=deploy)
