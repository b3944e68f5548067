"""Tensor parallel on two CPU ranks (gloo): the transformer blocks of Z-Image, of Qwen-Image
(with its edit and layered variants, which inherit its plan), of FLUX (and Kontext), of Wan
(T2V, I2V, VACE), of FLUX.2 (dev, klein) and of SD3 (and an SD3.5-style transformer) sharded
over the ranks (QKV and first MLP projections by output features, attention output and second
MLP projections by input features, all-reduced; FLUX.2's fused projections part by part; Wan's
across-heads q/k norms with their sum of squares all-reduced; a block's own adaLN modulation
split and all-gathered) give the output of one rank (fp32), with half of the sharded layers'
weight bytes on each rank. With CFG parallel (Wan on four ranks) each pair of shards runs one
branch. At the published sizes (omnistage.testing.published_sizes, on the meta device) a rank
holds <= 0.55x of every planned family's transformer. Families without a plan, and the fields it
does not combine with yet, are refused by name."""

from __future__ import annotations


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

from two_ranks import rank_results, run_ranks, run_two_ranks, save_rank_results
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
    "sd3": ("StableDiffusion3Pipeline", "a red fox"),  # the last block's text stream ends; modulation gathered
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
    # One rank keeps torch's linears, as tensor parallel does (accel/prepack.py): the same kernels on both sides.
    pipeline = pipeline_class(cls).from_pretrained(path, deploy=deploy or StageDeployConfig(prepack_linears=False))
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


def sd35_transformer_output(sharded: bool) -> torch.Tensor:
    """A tiny SD3.5-style transformer (no zoo pipeline has one): SD3.5 Medium's second, image-only
    attention in the first block and per-head q/k RMSNorms; its output for fixed random inputs,
    on one rank or sharded over the two (the real apply path, through a stand-in pipeline)."""
    from types import SimpleNamespace

    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)
    model = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=2,
                                  attention_head_dim=8, num_attention_heads=2, joint_attention_dim=8,
                                  caption_projection_dim=16, pooled_projection_dim=8, pos_embed_max_size=8,
                                  dual_attention_layers=(0,), qk_norm="rms_norm").eval()
    inputs = dict(hidden_states=torch.randn(2, 4, 8, 8), encoder_hidden_states=torch.randn(2, 5, 8),
                  pooled_projections=torch.randn(2, 8), timestep=torch.tensor([500.0, 20.0]))
    if sharded:
        cls = pipeline_class("StableDiffusion3Pipeline")
        apply(SimpleNamespace(transformer=model, supported_accelerations=cls.supported_accelerations,
                              reference_class=cls.reference_class, device=torch.device("cpu")),
              TensorParallelConfig(Degrees(tensor=2)))
        assert model.transformer_blocks[0].attn2.to_q.out_features == 8  # the dual attention is sharded
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def _rank_main(rank: int, port: int, paths: dict[str, str], out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results = {name: run_checks(name, path, StageDeployConfig(**TP_2)) for name, path in paths.items()}
    results["sd3.5"] = sd35_transformer_output(sharded=True)
    save_rank_results(out_dir, rank, results)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results(zoo, tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("tensor_parallel"))
    run_two_ranks(_rank_main, {name: str(zoo(name)) for name in FAMILIES}, out_dir, timeout=300)
    return rank_results(out_dir)


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
    # The rest of each block (norms; Z-Image's adaLN modulation) stays whole on every rank. A block's
    # own modulation where the plan gathers it (Qwen-Image, FLUX, SD3) is split: without that they hold 0.65-0.67.
    blocks = max(rank["bytes"]["blocks"] for rank in ranks) / one["bytes"]["blocks"]
    assert blocks <= (0.62 if name == "z-image" else 0.55)  # tiny: Z-Image 0.61, Wan-VACE 0.547, others 0.50-0.52


def test_sd35_dual_attention_and_qk_norms_on_two_ranks_equal_one(one_thread, two_rank_results):
    one = sd35_transformer_output(sharded=False)
    for results in two_rank_results:
        assert torch.allclose(results["sd3.5"], one, atol=TOLERANCE, rtol=0)


CFG_TP = dict(executor="mp", num_devices=4, cfg_parallel_size=2, tensor_parallel_size=2)


def _cfg_rank_main(rank: int, port: int, path: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    save_rank_results(out_dir, rank, run_checks("wan-t2v", path, StageDeployConfig(**CFG_TP)))
    dist.destroy_process_group()


def test_with_cfg_parallel_each_pair_of_shards_runs_one_branch(one_thread, zoo, tmp_path):
    run_ranks(4, _cfg_rank_main, str(zoo("wan-t2v")), str(tmp_path), timeout=300)
    ranks = rank_results(tmp_path, 4)
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
    ("SD3Transformer2DModel", "StableDiffusion3Pipeline"),  # SD3 medium, 2B
    ("QwenImageTransformer2DModel", "QwenImagePipeline"),  # Qwen-Image, 20B
    ("FluxTransformer2DModel", "FluxPipeline"),  # FLUX.1-dev, 12B
])
def test_at_the_published_size_a_rank_holds_about_half_the_transformer(model_class, family):
    """Built on the meta device (no memory) and sharded as rank 0 of 2. Wan and FLUX.2 share their
    modulation between blocks; SD3, Qwen-Image and FLUX have their own in each block (a third of
    its weights), sharded and gathered (0.67x and 0.64x of Qwen-Image and FLUX without it)."""
    from omnistage.testing.published_sizes import published_transformer, rank_share

    plans = pipeline_class(family).supported_accelerations.tensor_parallel
    assert rank_share(published_transformer(model_class), plans) <= 0.55  # 0.508, 0.513, 0.511, 0.505


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
