"""FSDP (`fsdp_degree: 2`) on two CPU ranks (gloo): the transformer of every pipeline that
declares it (Z-Image, Qwen-Image and its variants, FLUX and Kontext, ERNIE-Image, Krea 2,
LongCat-Image and its edit, Ovis-Image, HunyuanVideo 1.5 and its I2V, Wan T2V, I2V and VACE,
FLUX.2 dev and klein) sharded over the ranks with FSDP2, one unit per repeated block, gives the
output of one rank (fp32) with about half of the transformer's parameter bytes held by each rank
at rest, and one block whole at a time while it runs; a weight update or a drop of the weights
(sleep level 2) is refused. With CFG parallel on four ranks (HSDP's layout) each branch runs on
its own pair of shard holders. Families that do not declare it, and the fields it does not combine
with yet, are refused by name."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from torch.distributed.tensor import DTensor

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.weights import Dropped, load_weights
from omnistage.diffusion.accel import check_supported
from omnistage.diffusion.accel.declaration import check_declared
from omnistage.diffusion.accel.fsdp import blocks, local_parameter_bytes
from omnistage.diffusion.registry import pipeline_class
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

from parity import request_for
from two_ranks import rank_results, run_ranks, run_two_ranks, save_rank_results

FAMILIES = {  # zoo name -> diffusers class name, the second prompt of a batch of two
    "z-image": ("ZImagePipeline", "a small brown dog " * 8),
    "qwen-image": ("QwenImagePipeline", "a red fox"),
    "flux": ("FluxPipeline", "a red fox"),  # two kinds of block: double and single
    "qwen-image-edit": ("QwenImageEditPipeline", "a red fox"),  # the variants take their family's
    "qwen-image-layered": ("QwenImageLayeredPipeline", "a red fox"),
    "flux-kontext": ("FluxKontextPipeline", "a red fox"),
    "ernie-image": ("ErnieImagePipeline", "a red fox"),
    "krea2": ("Krea2Pipeline", "a red fox"),
    "longcat-image": ("LongCatImagePipeline", "a red fox"),
    "ovis-image": ("OvisImagePipeline", "a red fox"),
    "hunyuan-video": ("HunyuanVideo15Pipeline", "a red fox"),
    "qwen-image-edit-plus": ("QwenImageEditPlusPipeline", "a red fox"),
    "longcat-image-edit": ("LongCatImageEditPipeline", "a red fox"),
    "hunyuan-video-i2v": ("HunyuanVideo15ImageToVideoPipeline", "a red fox"),
    "wan-t2v": ("WanPipeline", "a red fox"),
    "wan-i2v": ("WanImageToVideoPipeline", "a red fox"),
    "wan-vace": ("WanVACEPipeline", "a red fox"),  # two kinds of block: Wan's and VACE's control blocks
    "flux2": ("Flux2Pipeline", "a red fox"),  # two kinds of block: double and single
    "flux2-klein": ("Flux2KleinPipeline", "a red fox"),  # true CFG: both branches
}
INPUT_IMAGE = {"qwen-image-edit", "qwen-image-edit-plus", "qwen-image-layered", "flux-kontext", "longcat-image-edit",
               "hunyuan-video-i2v"}
FSDP_2 = dict(executor="mp", num_devices=2, fsdp_degree=2)
TOLERANCE = 1e-4
"""The tensor-parallel tests' bound; FSDP gathers the very weights, so only kernels could differ."""


def run_checks(name: str, path: str, deploy: StageDeployConfig | None) -> dict:
    cls, second_prompt = FAMILIES[name]
    # One rank keeps torch's linears, as FSDP does (accel/prepack.py): the same kernels on both sides.
    pipeline = pipeline_class(cls).from_pretrained(path, deploy=deploy or StageDeployConfig(prepack_linears=False))
    transformer = pipeline.transformer
    units = blocks(transformer)
    whole_while_a_block_runs = []  # how many blocks hold their full weights as each block starts
    for block in units:
        block.register_forward_pre_hook(lambda *_: whole_while_a_block_runs.append(
            sum(not isinstance(next(b.parameters()), DTensor) for b in units)))
    call = {**zoo_call_kwargs(name), "num_inference_steps": 2}
    if name in INPUT_IMAGE:  # our requests: the size asked for, no max_sequence_length on the edits
        call.update(image=default_input_image(), height=64, width=64)
        call.pop("max_sequence_length", None)
    if name == "wan-i2v":  # the size asked for
        call.update(image=default_input_image())
    if name == "hunyuan-video-i2v":  # its video takes the image's aspect ratio at the model's size
        call.pop("height"), call.pop("width")
    if name == "flux-kontext":
        call.pop("max_area")
        call["auto_resize"] = call.pop("_auto_resize")
    first, second = request_for(call, seed=4, request_id="a"), request_for(
        {**call, "prompt": second_prompt}, seed=5, request_id="b")
    rows: list[int] = []  # the batch rows of each transformer call: one per request and CFG branch run here
    transformer.register_forward_pre_hook(lambda model, args, kwargs: rows.append(
        len(kwargs.get("hidden_states", args[0] if args else None))), with_kwargs=True)
    images = pipeline.decode_arrays(pipeline.denoise([first, second]))
    if deploy is not None:  # whole tensors cannot be copied into shards: refused before any copy
        with pytest.raises(ValueError, match="weight updates of parameters sharded over ranks"):
            load_weights({"vae": pipeline.vae, "transformer": transformer},
                         {f"transformer.{name}": torch.zeros(p.shape) for name, p in transformer.named_parameters()})
        with pytest.raises(ValueError, match=r"dropping weights \(sleep level 2\) of parameters sharded"):
            Dropped({"transformer": transformer}, [f"transformer.{name}" for name, _ in transformer.named_parameters()])
    return {"images": images, "accelerations": pipeline.accelerations, "at_rest": local_parameter_bytes(transformer),
            "whole_blocks": set(whole_while_a_block_runs), "num_blocks": len(units), "rows": sum(rows)}


CACHED = {  # backend -> (zoo name, its options): settings that skip some of 6 steps on these models
    "tea_cache": ("z-image", {"rel_l1_thresh": 0.4}),
    "first_block_cache": ("qwen-image", {"threshold": 0.5}),
    "easycache": ("z-image", {"threshold": 0.2, "warmup_steps": 1}),
    "mag_cache": ("qwen-image", {"threshold": 0.5, "warmup_steps": 1}),
}


def run_cached(backend: str, path: str, deploy: dict) -> dict:
    name, config = CACHED[backend]
    cls, _ = FAMILIES[name]
    pipeline = pipeline_class(cls).from_pretrained(
        path, deploy=StageDeployConfig(**deploy, cache_backend=backend, cache_config=config))
    request = request_for({**zoo_call_kwargs(name), "num_inference_steps": 6}, seed=4)
    states = pipeline.denoise([request])
    return {"images": pipeline.decode_arrays(states), "skipped": [s.num_forwards_skipped for s in states],
            "accelerations": pipeline.accelerations}


def _rank_main(rank: int, port: int, paths: dict[str, str], out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results: dict = {name: run_checks(name, path, StageDeployConfig(**FSDP_2)) for name, path in paths.items()}
    results["cached"] = {backend: run_cached(backend, paths[name], FSDP_2) for backend, (name, _) in CACHED.items()}
    save_rank_results(out_dir, rank, results)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results(zoo, tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("fsdp"))
    run_two_ranks(_rank_main, {name: str(zoo(name)) for name in FAMILIES}, out_dir, timeout=300)
    return rank_results(out_dir)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_fsdp_equals_one_rank_with_half_the_parameter_bytes_at_rest(zoo, two_rank_results, name):
    one = run_checks(name, str(zoo(name)), None)
    ranks = [results[name] for results in two_rank_results]
    for rank in ranks:
        assert rank["accelerations"] == ["fsdp"]
        for image, reference in zip(rank["images"], one["images"], strict=True):
            assert np.abs(image - reference).max() <= TOLERANCE
        assert rank["num_blocks"] == one["num_blocks"] >= 2
        # At rest, after the requests ran: each rank's shards only (FSDP2 pads a dim 0 it does not divide).
        assert rank["at_rest"] <= 0.55 * one["at_rest"]
        # A block is gathered whole for its forward only: the others stay sharded meanwhile.
        assert rank["whole_blocks"] == {1}
    assert sum(rank["at_rest"] for rank in ranks) >= one["at_rest"]  # every weight is held somewhere


CFG_FSDP = dict(executor="mp", num_devices=4, cfg_parallel_size=2, fsdp_degree=2)


def _cfg_rank_main(rank: int, port: int, path: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    save_rank_results(out_dir, rank, run_checks("qwen-image", path, StageDeployConfig(**CFG_FSDP)))
    dist.destroy_process_group()


def test_with_cfg_parallel_each_branch_runs_on_its_own_pair_of_shard_holders(zoo, tmp_path):
    """HSDP's layout on four ranks: the weights replicated over the two CFG branches and sharded
    within each branch's pair of ranks."""
    run_ranks(4, _cfg_rank_main, str(zoo("qwen-image")), str(tmp_path), timeout=300)
    one = run_checks("qwen-image", str(zoo("qwen-image")), None)
    for four in rank_results(tmp_path, 4):
        assert sorted(four["accelerations"]) == ["cfg_parallel", "fsdp"]
        assert four["rows"] * 2 == one["rows"]  # its branch only: half the rows of one rank running both
        assert four["at_rest"] <= 0.55 * one["at_rest"] and four["whole_blocks"] == {1}
        for image, reference in zip(four["images"], one["images"], strict=True):
            assert np.abs(image - reference).max() <= TOLERANCE


@pytest.mark.parametrize("backend", list(CACHED))
def test_step_caches_under_fsdp_skip_the_steps_one_rank_skips_with_its_output(zoo, two_rank_results, backend):
    # Every rank computes the same values, so each makes the cache's decisions of one rank: the
    # skipped blocks are still called (gathered, then answered from the cache) on every rank alike.
    one = run_cached(backend, str(zoo(CACHED[backend][0])), {})
    assert one["skipped"][0] > 0
    for results in two_rank_results:
        rank = results["cached"][backend]
        assert rank["accelerations"] == ["fsdp", backend]
        assert rank["skipped"] == one["skipped"]
        for image, reference in zip(rank["images"], one["images"], strict=True):
            assert np.abs(image - reference).max() <= TOLERANCE


def test_every_pipeline_that_declares_it_is_tested_here():
    from omnistage.diffusion.support import rows

    assert {row.key for row in rows() if row.accelerations.fsdp} == {cls for cls, _ in FAMILIES.values()}


def test_families_that_do_not_declare_it_and_fields_not_combined_are_refused_by_name():
    deploy = StageDeployConfig(**FSDP_2)
    sd3 = pipeline_class("StableDiffusion3Pipeline")
    with pytest.raises(ValueError, match="fsdp_degree=2: StableDiffusion3Pipeline cannot take it"):
        check_declared(sd3.reference_class, sd3.supported_accelerations, deploy)
    with pytest.raises(ValueError, match=r"stage 0: fsdp_degree=2 cannot be combined with offload, "
                                         r"quantization"):  # at start-up, before anything loads
        check_supported("0", StageDeployConfig(**FSDP_2, quantization="int8", offload="model"))
    with pytest.raises(ValueError, match="fsdp_degree=2 cannot be combined with cache_backend=cache_dit"):
        check_supported("0", StageDeployConfig(**FSDP_2, cache_backend="cache_dit"))  # its own hooks: untested
    with pytest.raises(ValueError, match="fsdp_degree=2 cannot be combined with ulysses_degree"):
        check_supported("0", StageDeployConfig(executor="mp", num_devices=4, fsdp_degree=2, ulysses_degree=2))
    with pytest.raises(ValueError, match=r"fsdp_degree=2 = 4, but num_devices=2"):
        StageDeployConfig(executor="mp", num_devices=2, fsdp_degree=2, cfg_parallel_size=2)


def test_engine_with_fsdp_in_step_mode_returns_the_images_of_one_rank(zoo):
    """The user's path: DiffusionEngine, `executor: mp`, both ranks running every step of a batch
    that a second request joins while the first runs."""
    from omnistage.diffusion.engine import DiffusionEngine

    from test_engine_z_image import PROMPTS, assert_same_image, images_alone, pixels, req, run

    path = zoo("z-image")
    engine = DiffusionEngine(path, config=StageDeployConfig(max_num_seqs=2))
    alone = images_alone(engine, PROMPTS[:2])
    engine.close()
    engine = DiffusionEngine(path, config=StageDeployConfig(**FSDP_2, step_execution=True, max_num_seqs=2))
    try:
        engine.add_request(req("r0", PROMPTS[0], seed=0))
        outs = {"r0": engine.step()}
        engine.add_request(req("r1", PROMPTS[1], seed=1))  # joins the running batch
        for rid, out in run(engine).items():
            outs.setdefault(rid, []).extend(out)
    finally:
        engine.close()
    for i in range(2):
        assert_same_image(pixels(outs[f"r{i}"][-1]), alone[i])
