"""`vae_patch_parallel_size: 2` on two CPU ranks (gloo), encode side: an edit or image-to-video
request's input image is encoded in tiles shared over the ranks (each rank encodes about half
of them), and the request's output equals the same request with the input encoded by one
rank's tiled encode, for each kind of VAE (AutoencoderKL: FLUX Kontext, LongCat-Image-Edit;
causal per-frame: Qwen-Image-Edit, Wan and SANA-Video image-to-video)."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.accel.vae_patch_parallel import TileSharing
from omnistage.diffusion.registry import pipeline_class
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

from parity import request_for
from test_vae_tiling import SIDE, WITH_IMAGE, request, small_tiles
from two_ranks import rank_results, run_two_ranks, save_rank_results

SHARED = dict(executor="mp", num_devices=2, vae_patch_parallel_size=2)
FAMILIES = {  # zoo name -> (diffusers class name, the degree that keeps both ranks' states identical)
    "qwen-image-edit": ("QwenImageEditPipeline", dict(fsdp_degree=2)),
    "flux-kontext": ("FluxKontextPipeline", dict(fsdp_degree=2)),
    "wan-i2v": ("WanImageToVideoPipeline", dict(cfg_parallel_size=2)),
    "longcat-image-edit": ("LongCatImageEditPipeline", dict(cfg_parallel_size=2)),  # AutoencoderKL
    "sana-video-i2v": ("SanaImageToVideoPipeline", dict(cfg_parallel_size=2)),  # Wan's causal VAE
}


def edit_request(name: str):
    if name in WITH_IMAGE:  # the vae-tiling tests' requests
        return request(name)
    call = {**zoo_call_kwargs(name), "num_inference_steps": 2, "height": SIDE, "width": SIDE,
            "image": default_input_image(SIDE)}
    if name == "flux-kontext":  # our request: the size asked for, auto_resize an extra
        call.pop("max_area")
        call["auto_resize"] = call.pop("_auto_resize")
    if "frames" in call:  # diffusers' SANA-Video pipelines call the frame count `frames`
        call["num_frames"] = call.pop("frames")
    return request_for(call, seed=3)


def _rank_main(rank: int, port: int, paths: dict[str, str], out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results = {}
    for name, path in paths.items():
        cls, degree = FAMILIES[name]
        pipeline = pipeline_class(cls).from_pretrained(path, deploy=StageDeployConfig(**SHARED, **degree))
        sharing = pipeline.vae.encoder
        assert isinstance(sharing, TileSharing)
        small_tiles(pipeline.vae)
        modes, encoded = [], []
        sharing.register_forward_pre_hook(lambda m, args, kwargs: modes.append(m.mode), with_kwargs=True)
        sharing.module.register_forward_pre_hook(lambda m, args: encoded.append(1))
        (shared,) = pipeline.decode_arrays(pipeline.denoise([edit_request(name)]))
        num_calls = modes.count("recording")
        num_encoded = len(encoded)
        # The same request with the input image through one rank's tiled encode.
        pipeline.vae_encode = lambda pixels: pipeline.vae.encode(pixels)
        (alone,) = pipeline.decode_arrays(pipeline.denoise([edit_request(name)]))
        results[name] = {"shared": shared, "alone": alone, "calls": num_calls, "encoded": num_encoded}
    save_rank_results(out_dir, rank, results)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(zoo, tmp_path_factory):
    paths = {name: str(zoo(name)) for name in FAMILIES}
    out_dir = str(tmp_path_factory.mktemp("vae_patch_parallel_encode"))
    run_two_ranks(_rank_main, paths, out_dir, timeout=300)
    return rank_results(out_dir)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_input_image_tiles_shared_over_two_ranks_equal_one_rank_tiled_encode(results, name):
    for per_rank in results:
        r = per_rank[name]
        assert np.abs(r["shared"] - r["alone"]).max() <= 1e-6
    calls = results[0][name]["calls"]
    assert calls >= 4  # several tiles (x frame chunks) went through the encoder
    # Each rank encoded its share: together every tile once, neither all of them.
    encoded = [per_rank[name]["encoded"] for per_rank in results]
    assert sum(encoded) == calls and 0 < encoded[0] < calls
