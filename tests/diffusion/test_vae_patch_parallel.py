"""`vae_patch_parallel_size: 2` on two CPU ranks (gloo): each rank decodes about half of the
tiles and, gathered, the output equals one rank's tiled decode of the same latents, for
each kind of VAE (AutoencoderKL: Z-Image; causal per-frame: Qwen-Image, Wan video)."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.accel.vae_patch_parallel import TileSharing
from omnistage.diffusion.registry import pipeline_class

from test_vae_tiling import request, small_tiles
from two_ranks import rank_results, run_two_ranks, save_rank_results

FAMILIES = {"z-image": "ZImagePipeline", "qwen-image": "QwenImagePipeline", "wan-t2v": "WanPipeline"}
# CFG parallel keeps both ranks' latents identical; the VAE tiles are shared between them.
DEPLOY = dict(executor="mp", num_devices=2, cfg_parallel_size=2, vae_patch_parallel_size=2)


def _rank_main(rank: int, port: int, paths: dict[str, str], out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results = {}
    for name, path in paths.items():
        pipeline = pipeline_class(FAMILIES[name]).from_pretrained(path, deploy=StageDeployConfig(**DEPLOY))
        assert pipeline.accelerations == ["cfg_parallel", "vae_patch_parallel"]
        sharing = pipeline.vae.decoder
        assert isinstance(sharing, TileSharing)
        small_tiles(pipeline.vae)
        states = pipeline.denoise([request(name)])
        calls = []
        sharing.register_forward_pre_hook(lambda m, args, kwargs: calls.append(m.mode), with_kwargs=True)
        decoded = []
        sharing.module.register_forward_pre_hook(lambda m, args: decoded.append(1))
        (shared,) = pipeline.decode_arrays(states)
        num_calls = calls.count("recording")
        # The same latents through one rank's tiled decode (the sharing decoder switched off).
        pipeline.vae_decode = lambda z: pipeline.vae.decode(z, return_dict=False)[0]
        (alone,) = pipeline.decode_arrays(states)
        results[name] = {"shared": shared, "alone": alone, "calls": num_calls, "decoded": len(decoded) - num_calls}
    save_rank_results(out_dir, rank, results)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(zoo, tmp_path_factory):
    paths = {name: str(zoo(name)) for name in FAMILIES}
    out_dir = str(tmp_path_factory.mktemp("vae_patch_parallel"))
    run_two_ranks(_rank_main, paths, out_dir, timeout=300)
    return rank_results(out_dir)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tiles_shared_over_two_ranks_equal_one_rank_tiled_decode(results, name):
    for per_rank in results:
        r = per_rank[name]
        assert np.abs(r["shared"] - r["alone"]).max() <= 1e-6
    calls = results[0][name]["calls"]
    assert calls >= 4  # several tiles (x frames) went through the decoder
    # Each rank decoded its share: together every tile once, neither all of them.
    decoded = [per_rank[name]["decoded"] for per_rank in results]
    assert sum(decoded) == calls and 0 < decoded[0] < calls


def test_refused_without_enough_ranks(zoo):
    deploy = StageDeployConfig(executor="mp", num_devices=2, cfg_parallel_size=2, vae_patch_parallel_size=2)
    with pytest.raises(ValueError, match="needs executor 'mp'"):
        pipeline_class("ZImagePipeline").from_pretrained(str(zoo("z-image")), deploy=deploy)
