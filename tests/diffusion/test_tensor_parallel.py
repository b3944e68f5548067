"""Tensor parallel on two CPU ranks (gloo): the transformer blocks of Z-Image, of Qwen-Image
(with its edit and layered variants, which inherit its plan), of FLUX (and Kontext), of Wan
(T2V and I2V) and of FLUX.2 sharded over the ranks (QKV and first MLP projections by output
features, attention output and second MLP projections by input features, all-reduced; FLUX.2's
fused projections part by part; Wan's across-heads q/k norms with their sum of squares
all-reduced) give the output of one rank (fp32), with half of the sharded layers' weight bytes
on each rank. With CFG parallel (Wan on four ranks) each pair of shards runs one branch. At the
published sizes (diffusers' default configs, on the meta device) a rank holds <= 0.55x of
Wan's, FLUX.2's and Z-Image's transformer. Families without a plan, and the fields it does not
combine with yet, are refused by name."""

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

from two_ranks import run_ranks, run_two_ranks
from parity import request_for

FAMILIES = {  # zoo name -> diffusers class name, the second prompt of a batch of two
    "z-image": ("ZImagePipeline", "a small brown dog " * 8),  # caption runs padded to different lengths
    "qwen-image": ("QwenImagePipeline", "a red fox"),  # prompts of different lengths under a mask
    "qwen-image-edit": ("QwenImageEditPipeline", "a red fox"),  # its plan is Qwen-Image's (a subclass)
    "qwen-image-layered": ("QwenImageLayeredPipeline", "a red fox"),
    "flux": ("FluxPipeline", "a red fox"),  # double and single blocks (the latter's proj_out reads two shards)
    "flux-kontext": ("FluxKontextPipeline", "a red fox"),
    "wan-t2v": ("WanPipeline", "a red fox"),  # q/k RMSNorms across all heads: sharded, sum of squares all-reduced
    "wan-i2v": ("WanImageToVideoPipeline", "a red fox"),  # and the image keys' norm
    "wan-vace": ("WanVACEPipeline", "a red fox"),  # and its control blocks (text only: they run on zeros)
    "flux2": ("Flux2Pipeline", "a red fox"),  # the single blocks' fused QKV + MLP projection, cut part by part
    "flux2-klein": ("Flux2KleinPipeline", "a red fox"),  # FLUX.2's plan, with true CFG (both branches here)
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
    unique_blocks = {id(b): b for _, b in blocks}.values()  # Wan I2V's image keys: a second plan, same blocks
    return {"sharded": sum(w.numel() * w.element_size() for w in sharded), "blocks": nbytes(unique_blocks)}


def denoiser_rows(pipeline) -> list[int]:
    """The batch rows of each transformer call: one per request and CFG branch run on this rank."""
    rows: list[int] = []
    pipeline.transformer.register_forward_pre_hook(
        lambda model, args, kwargs: rows.append(len(kwargs.get("hidden_states", args[0] if args else None))),
        with_kwargs=True)
    return rows


def run_checks(name: str, path: str, deploy: StageDeployConfig | None) -> dict:
    cls, second_prompt = FAMILIES[name]
    pipeline = pipeline_class(cls).from_pretrained(path, deploy=deploy)
    call = {**zoo_call_kwargs(name), "num_inference_steps": 2}
    if name == "flux-kontext":  # our request: the size asked for, auto_resize an extra
        call.pop("max_area")
        call.update(auto_resize=call.pop("_auto_resize"), image=default_input_image())
    if name == "wan-i2v":
        call.update(image=default_input_image())
    if name in INPUT_IMAGE:
        call.update(image=default_input_image(), height=64, width=64)
        call.pop("max_sequence_length", None)  # an extra of diffusers' call that these pipelines do not take
    first, second = request_for(call, seed=4, request_id="a"), request_for(
        {**call, "prompt": second_prompt}, seed=5, request_id="b")
    rows = denoiser_rows(pipeline)
    images = pipeline.decode_arrays(pipeline.denoise([first, second]))
    return {"images": images, "bytes": weight_bytes(pipeline), "accelerations": pipeline.accelerations,
            "rows": sum(rows)}


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


CFG_TP = dict(executor="mp", num_devices=4, cfg_parallel_size=2, tensor_parallel_size=2)


def _cfg_rank_main(rank: int, port: int, path: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    torch.save(run_checks("wan-t2v", path, StageDeployConfig(**CFG_TP)), os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_with_cfg_parallel_each_pair_of_shards_runs_one_branch(one_thread, zoo, tmp_path):
    run_ranks(4, _cfg_rank_main, str(zoo("wan-t2v")), str(tmp_path), timeout=300)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(4)]
    one = run_checks("wan-t2v", str(zoo("wan-t2v")), None)
    for rank in ranks:
        assert sorted(rank["accelerations"]) == ["cfg_parallel", "tensor_parallel"]
        assert rank["rows"] * 2 == one["rows"]  # its branch only: half the rows of one rank running both
        assert rank["bytes"]["sharded"] * 2 == one["bytes"]["sharded"]
        for image, reference in zip(rank["images"], one["images"], strict=True):
            assert np.abs(image - reference).max() <= TOLERANCE


@pytest.mark.parametrize("model_class, family", [
    ("WanTransformer3DModel", "WanPipeline"),  # Wan 2.1 14B
    ("Flux2Transformer2DModel", "Flux2Pipeline"),  # FLUX.2-dev, 32B
    ("ZImageTransformer2DModel", "ZImagePipeline"),  # Z-Image, 6B
])
def test_at_the_published_size_a_rank_holds_about_half_the_transformer(model_class, family):
    """diffusers' default config of each transformer is its published checkpoint's; built on the
    meta device (no memory) and sharded as rank 0 of 2. The modulation these families share
    between blocks stays whole; Qwen-Image and FLUX keep theirs in every block, unsharded
    (0.67x and 0.64x: not claimed here)."""
    import diffusers

    from omnistage.diffusion.accel.tensor_parallel import shard_block

    with torch.device("meta"):
        model = getattr(diffusers, model_class)()
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    for plan in pipeline_class(family).supported_accelerations.tensor_parallel:
        for block in plan.blocks(model):
            shard_block(block, plan, rank=0, size=2, group=None)
    assert sum(p.numel() * p.element_size() for p in model.parameters()) <= 0.55 * full  # 0.508, 0.513, 0.511


def test_families_without_a_plan_and_fields_not_combined_are_refused_by_name():
    deploy = StageDeployConfig(**TP_2)
    sdxl = pipeline_class("StableDiffusionXLPipeline")
    with pytest.raises(ValueError, match="tensor_parallel_size=2: StableDiffusionXLPipeline cannot take it"):
        check_declared(sdxl.reference_class, sdxl.supported_accelerations, deploy)
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


def test_a_degree_that_does_not_divide_a_part_of_a_fused_projection_is_refused():
    """FLUX.2's single-block processor splits the fused output by its parts' global ratio, which an
    uneven cut would shift: every fused part must divide. 2 heads of 3 dims and an MLP of 2.5x:
    15-wide MLP parts (the double blocks' SwiGLU halves come first)."""
    from types import SimpleNamespace

    from diffusers import Flux2Transformer2DModel

    cls = pipeline_class("Flux2Pipeline")
    with torch.device("meta"):
        model = Flux2Transformer2DModel(num_layers=1, num_single_layers=1, attention_head_dim=3, num_attention_heads=2,
                                        mlp_ratio=2.5, axes_dims_rope=(1, 1, 1, 0), joint_attention_dim=8,
                                        timestep_guidance_channels=8, in_channels=4)
    pipeline = SimpleNamespace(transformer=model, supported_accelerations=cls.supported_accelerations,
                               reference_class=cls.reference_class)
    with pytest.raises(ValueError, match="tensor_parallel_size=2 does not divide the 15 features of a part of "
                                         "ff.linear_in of Flux2Pipeline"):
        apply(pipeline, TensorParallelConfig(Degrees(tensor=2)))
