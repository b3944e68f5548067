"""Tensor parallel on two CPU ranks (gloo): the transformer blocks of Z-Image, of Qwen-Image
(with its edit and layered variants, which inherit its plan) and of FLUX (and Kontext)
sharded over the ranks (QKV and first MLP projections by output features, attention output and second MLP
projections by input features, all-reduced) give the output of one rank (fp32), with half
of the sharded layers' weight bytes on each rank. Families without a plan, and the fields it
does not combine with yet, are refused by name."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.accel import check_supported
from omnistage.diffusion.accel.declaration import check_declared
from omnistage.diffusion.accel.parallel_groups import Degrees
from omnistage.diffusion.accel.tensor_parallel import TensorParallelConfig, apply, from_deploy
from omnistage.diffusion.registry import pipeline_class
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

from two_ranks import run_two_ranks
from parity import request_for

FAMILIES = {  # zoo name -> diffusers class name, the second prompt of a batch of two
    "z-image": ("ZImagePipeline", "a small brown dog " * 8),  # caption runs padded to different lengths
    "qwen-image": ("QwenImagePipeline", "a red fox"),  # prompts of different lengths under a mask
    "qwen-image-edit": ("QwenImageEditPipeline", "a red fox"),  # its plan is Qwen-Image's (a subclass)
    "qwen-image-layered": ("QwenImageLayeredPipeline", "a red fox"),
    "flux": ("FluxPipeline", "a red fox"),  # double and single blocks (the latter's proj_out reads two shards)
    "flux-kontext": ("FluxKontextPipeline", "a red fox"),
}
INPUT_IMAGE = {"qwen-image-edit", "qwen-image-layered"}
TP_2 = dict(executor="mp", num_devices=2, tensor_parallel_size=2)
TOLERANCE = 1e-4
"""Far inside 1/255 of a pixel value: only the order of the sums differs from one rank."""


def weight_bytes(pipeline) -> dict[str, int]:
    """Bytes of the sharded layers' weights (a row layer's bias stays whole) and of all the
    parameters of the blocks the plan names."""
    plans = pipeline.supported_accelerations.tensor_parallel
    blocks = [(plan, block) for plan in plans for block in plan.blocks(pipeline.transformer)]

    def nbytes(modules) -> int:
        return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())

    sharded = [b.get_submodule(name).weight for plan, b in blocks for name in (*plan.column, *plan.row)]
    return {"sharded": sum(w.numel() * w.element_size() for w in sharded), "blocks": nbytes(b for _, b in blocks)}


def run_checks(name: str, path: str, deploy: StageDeployConfig | None) -> dict:
    cls, second_prompt = FAMILIES[name]
    pipeline = pipeline_class(cls).from_pretrained(path, deploy=deploy)
    call = {**zoo_call_kwargs(name), "num_inference_steps": 2}
    if name == "flux-kontext":  # our request: the size asked for, auto_resize an extra
        call.pop("max_area")
        call.update(auto_resize=call.pop("_auto_resize"), image=default_input_image())
    if name in INPUT_IMAGE:
        call.update(image=default_input_image(), height=64, width=64)
        call.pop("max_sequence_length", None)  # an extra of diffusers' call that these pipelines do not take
    first, second = request_for(call, seed=4, request_id="a"), request_for(
        {**call, "prompt": second_prompt}, seed=5, request_id="b")
    images = pipeline.decode_arrays(pipeline.denoise([first, second]))
    return {"images": images, "bytes": weight_bytes(pipeline), "accelerations": pipeline.accelerations}


def _rank_main(rank: int, port: int, paths: dict[str, str], out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results = {name: run_checks(name, path, StageDeployConfig(**TP_2)) for name, path in paths.items()}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results(zoo, tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("tensor_parallel"))
    run_two_ranks(_rank_main, {name: str(zoo(name)) for name in FAMILIES}, out_dir, timeout=300)
    return [torch.load(os.path.join(out_dir, f"rank{rank}.pt"), weights_only=False) for rank in range(2)]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tensor_parallel_equals_one_rank_with_half_the_sharded_weights(one_thread, zoo, two_rank_results, name):
    one = run_checks(name, str(zoo(name)), None)
    ranks = [results[name] for results in two_rank_results]
    for rank in ranks:
        assert rank["accelerations"] == ["tensor_parallel"]
        for image, reference in zip(rank["images"], one["images"], strict=True):
            assert np.abs(image - reference).max() <= TOLERANCE
    sharded = [rank["bytes"]["sharded"] for rank in ranks]
    assert sum(sharded) == one["bytes"]["sharded"]  # nothing held twice
    assert max(sharded) <= 0.51 * one["bytes"]["sharded"]  # Z-Image's tiny MLP width (85) splits 43 / 42
    # The rest of each block (norms, the adaLN modulation) stays whole on every rank.
    blocks = max(rank["bytes"]["blocks"] for rank in ranks) / one["bytes"]["blocks"]
    assert blocks < 0.7  # tiny: Z-Image 0.61, FLUX 0.65, Qwen-Image 0.67 of the blocks' bytes per rank


def test_families_without_a_plan_and_fields_not_combined_are_refused_by_name():
    deploy = StageDeployConfig(**TP_2)
    wan = pipeline_class("WanPipeline")
    with pytest.raises(ValueError, match="tensor_parallel_size=2: WanPipeline cannot take it"):
        check_declared(wan.reference_class, wan.supported_accelerations, deploy)
    z_image = pipeline_class("ZImagePipeline")
    check_declared(z_image.reference_class, z_image.supported_accelerations, deploy)
    with pytest.raises(ValueError, match="tensor_parallel_size=2 cannot be combined with ulysses_degree"):
        from_deploy(StageDeployConfig(executor="mp", num_devices=4, tensor_parallel_size=2, ulysses_degree=2))
    with pytest.raises(ValueError, match=r"stage 0: tensor_parallel_size=2 cannot be combined with offload, "
                                         r"quantization"):  # at start-up, before anything loads
        check_supported("0", StageDeployConfig(**TP_2, quantization="int8", offload="model"))


def test_a_degree_that_does_not_divide_the_heads_is_refused_naming_both(zoo):
    pipeline = pipeline_class("ZImagePipeline").from_pretrained(str(zoo("z-image")))
    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not divide the 2 attention heads of ZImage"):
        apply(pipeline, TensorParallelConfig(Degrees(tensor=3)))
