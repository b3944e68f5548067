"""Every step cache on shards of the sequence (step_cache.check_sequence_split), on two CPU ranks:
Qwen-Image, FLUX, FLUX.2-klein, Wan and SD3, whose plans gather the sequence after the cached
blocks, so each rank's blocks run on its shard of it; and Z-Image's first-block cache, whose first
block returns a shard of the sequence its blocks take and return whole (the head gathers it).

Per family, one run of the rank pair: each cache under Ulysses on two requests, the zoo's and one
whose token counts have the other parity (one text token less; 3 x 3 image tokens where the
family pads, which the two ranks split 5 + 5, so a padding row sits among the cached tokens);
one cache under ring; one with CFG parallel. And one cache under Ulysses 2 x ring 2 on four ranks
(FLUX.2-klein), and TeaCache with Wan 2.2's per-token timesteps. Under Ulysses and ring every rank skips what one rank skips (the same counts) and
the output is one rank's (<= 1/255); EasyCache's and MagCache's learned rates
equal one rank's, which they only do when every distance is summed over the ranks with the
padding left out (a rank's own shard gives another rate). With CFG parallel each rank caches its
branch: their counts add up to one rank's.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.registry import pipeline_class
from omnistage.testing import call_kwargs as zoo_call_kwargs

from parity import request_for
from two_ranks import rank_results, run_ranks, run_two_ranks, save_rank_results

STEPS = 8
TOLERANCE = 1 / 255
TWO = {"executor": "mp", "num_devices": 2}
DEGREES = {"ulysses": {**TWO, "ulysses_degree": 2}, "ring": {**TWO, "ring_degree": 2},
           "cfg": {**TWO, "cfg_parallel_size": 2},
           "ulysses x ring": {"executor": "mp", "num_devices": 4, "ulysses_degree": 2, "ring_degree": 2}}
SHARED = {"tea_cache": {"rel_l1_thresh": 0.2}, "easycache": {"threshold": 0.1, "warmup_steps": 1},
          "mag_cache": {"threshold": 0.1, "warmup_steps": 1}}
SHORTER_ODD = {"max_sequence_length": 63, "height": 48, "width": 48}


def first_block(threshold: float) -> dict[str, dict[str, Any]]:
    return {"first_block_cache": {"threshold": threshold, "warmup_steps": 1}}


@dataclass(frozen=True)
class Family:
    key: str
    """The diffusers class the zoo model is served as."""
    configs: dict[str, dict[str, Any]]
    """Backend -> cache_config skipping some of the 8 steps' 16 forwards on one rank, for every request."""
    other: dict[str, Any]
    """The second request's changes to the zoo call: token counts of the other parity."""
    ring: str
    """The backend run under ring; another one runs with CFG parallel."""
    cfg: str
    call: dict[str, Any] | None = None
    """Changes to the zoo call for every request (FLUX guides only with a negative prompt and true CFG)."""


FAMILIES = {
    "qwen-image": Family("QwenImagePipeline", {**first_block(0.6), **SHARED},
                         {"prompt": "a red fox", "height": 48, "width": 48}, ring="tea_cache", cfg="easycache"),
    "flux": Family("FluxPipeline", {**first_block(0.3), **SHARED}, SHORTER_ODD, ring="easycache", cfg="mag_cache",
                   call={"negative_prompt": "blurry", "true_cfg_scale": 2.0}),
    # Its single-stream blocks hold a rank's text chunk, then its image chunk: both padded.
    "flux2-klein": Family("Flux2KleinPipeline", {**first_block(1.0), **SHARED}, SHORTER_ODD, ring="mag_cache",
                          cfg="first_block_cache"),
    # Wan pads nothing (an odd video token count is refused) and keeps its prompt whole.
    "wan-t2v": Family("WanPipeline", {**first_block(0.1), **SHARED}, {"max_sequence_length": 31},
                      ring="first_block_cache", cfg="tea_cache"),
    # 77 CLIP + 64 T5 text tokens: the zoo's request has an odd count, the other an even one.
    "sd3": Family("StableDiffusion3Pipeline", {**first_block(0.3), **SHARED}, SHORTER_ODD, ring="tea_cache",
                  cfg="easycache"),
    # Its plan gathers the sequence inside the last block, so its other caches see it whole (with Ulysses in
    # test_declared_accelerations.py); the first-block cache gathers the first block's output, a shard. 19
    # prompt tokens where the zoo's has 20; the long negative prompt pads the cond row to the uncond's 96
    # tokens (masked) until CFG stops at step 4, then the cond row runs alone at 64 and step 4 skips with
    # the residual of step 3's 96 tokens, cut (the distances clear the threshold by 0.029 or more).
    "z-image": Family("ZImagePipeline", first_block(0.7),
                      {"prompt": "a photo of a cat on a red chair", "cfg_truncation": 0.2,
                       "negative_prompt": "bad quality, blurry, low resolution, jpeg artifacts, watermark, text, "
                                          "deformed hands, extra fingers, cropped, out of frame, oversaturated"},
                      ring="first_block_cache", cfg="first_block_cache"),
}


def requests(name: str) -> dict[str, dict[str, Any]]:
    family = FAMILIES[name]
    call = {**zoo_call_kwargs(name), **(family.call or {}), "num_inference_steps": STEPS}
    return {"zoo": call, "other parity": {**call, **family.other}}


def runs(name: str) -> list[tuple[str, str, list[str]]]:
    """(degree, backend, request labels) the two ranks run for the family."""
    family = FAMILIES[name]
    labels = list(requests(name))
    return ([("ulysses", backend, labels) for backend in family.configs]
            + [("ring", family.ring, labels), ("cfg", family.cfg, labels[:1])])


def load(name: str, path: str, backend: str, **fields):
    config = StageDeployConfig(cache_backend=backend, cache_config=FAMILIES[name].configs[backend], **fields)
    return pipeline_class(FAMILIES[name].key).from_pretrained(path, deploy=config)


def run(pipeline, call: dict[str, Any]) -> tuple[np.ndarray, dict[str, int], list[float]]:
    """The output, the forwards computed and skipped, and the caches' learned rates."""
    (state,) = pipeline.denoise([request_for(call, seed=3)])
    (arr,) = pipeline.decode_arrays([state])
    return arr, pipeline.state_metrics(state), cache_measures(state)


def cache_measures(state) -> list[float]:
    """EasyCache's and MagCache's last learned rate, by branch (none for the others): measured on shards,
    it is each rank's own unless summed over the ranks."""
    return [cache.rate for cache in state.step_cache.branches.values() if cache.rate is not None]


def _rank_main(rank: int, port: int, name: str, path: str, out_dir: str, plan: list, calls: dict,
               world_size: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    results = {}
    try:
        for degree, backend, labels in plan:
            pipeline = load(name, path, backend, **DEGREES[degree])
            results[degree, backend] = pipeline.accelerations
            for label in labels:
                arr, metrics, measures = run(pipeline, calls[label])
                results[degree, backend, label] = (arr if rank == 0 else None, metrics, measures)
    finally:
        save_rank_results(out_dir, rank, results)
        dist.destroy_process_group()


def check_against_one_rank(name: str, path: str, plan: list, calls: dict, ranks: list[dict]) -> None:
    """Each run of `plan` on the ranks (their results) against one rank with the same cache."""
    one_rank = {}
    for backend in {backend for _, backend, _ in plan}:
        pipeline = load(name, path, backend)
        one_rank.update({(backend, label): run(pipeline, call) for label, call in calls.items()})
    applied = {"cfg": ["cfg_parallel"]}
    for degree, backend, labels in plan:
        assert set(ranks[0][degree, backend]) == {backend, *applied.get(degree, ["sequence_parallel"])}
        for label in labels:
            want, want_metrics, want_measures = one_rank[backend, label]
            got, metrics, measures = ranks[0][degree, backend, label]
            where = (degree, backend, label)
            assert want_metrics["num_forwards_skipped"] > 0, where
            assert np.abs(got - want).max() <= TOLERANCE, where
            if degree == "cfg":  # each rank runs (and caches) one branch: their counts add up to one rank's
                rank1_metrics = ranks[1][degree, backend, label][1]
                assert {k: metrics[k] + rank1_metrics[k] for k in want_metrics} == want_metrics, where
                continue
            # Each rank holds a shard of every row: the same decisions as one rank, from the same distances.
            assert bool(measures) == (backend in ("easycache", "mag_cache")), where
            assert np.allclose(measures, want_measures, rtol=1e-4, atol=1e-6), where
            for other in ranks:
                assert other[degree, backend, label][1:] == (want_metrics, measures), where


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_step_cache_on_shards_of_the_sequence_decides_as_one_rank(one_thread, zoo, tmp_path, name):
    path, plan, calls = str(zoo(name)), runs(name), requests(name)
    run_two_ranks(_rank_main, name, path, str(tmp_path), plan, calls, 2, timeout=300)
    ranks = rank_results(tmp_path)
    check_against_one_rank(name, path, plan, calls, ranks)


HYBRID = ("flux2-klein", "easycache", {"max_sequence_length": 5, "height": 48, "width": 48})
"""Ulysses 2 x ring 2 on four ranks: FLUX.2's text and image shards, both padded: 5 text tokens are 2 + 2
+ (1 + 1 padding) + 2 padding, 9 image tokens 3 + 3 + 3 + 3 padding. Each rank takes its chunk of the
padding mask in the ring-major order of the split (the third chunk, which holds real text tokens and
padding, goes to ring rank 1, Ulysses rank 0); EasyCache's rates are sums over the four ranks."""


def test_a_step_cache_under_ulysses_by_ring_on_four_ranks_decides_as_one_rank(one_thread, zoo, tmp_path):
    name, backend, changes = HYBRID
    path, plan = str(zoo(name)), [("ulysses x ring", backend, ["padded"])]
    calls = {"padded": {**requests(name)["zoo"], **changes}}
    run_ranks(4, _rank_main, name, path, str(tmp_path), plan, calls, 4, timeout=300)
    ranks = rank_results(tmp_path, 4)
    check_against_one_rank(name, path, plan, calls, ranks)


def test_tea_cache_with_per_token_timesteps_under_ulysses_decides_as_one_rank(one_thread, zoo, tmp_path):
    """Wan 2.2 TI2V's per-token timesteps (`expand_timesteps`, set on a copy of the zoo's Wan): the plan
    splits them before the blocks, so TeaCache's modulated input is made from the rank's shard of the
    tokens the head takes, not from the whole sequence."""
    name, path, out = "wan-t2v", tmp_path / "wan-ti2v", tmp_path / "out"
    shutil.copytree(zoo(name), path)
    out.mkdir()
    index = path / "model_index.json"
    index.write_text(json.dumps({**json.loads(index.read_text()), "expand_timesteps": True}))
    plan, calls = [("ulysses", "tea_cache", ["zoo"])], {"zoo": requests(name)["zoo"]}
    run_two_ranks(_rank_main, name, str(path), str(out), plan, calls, 2, timeout=300)
    ranks = rank_results(out)
    check_against_one_rank(name, str(path), plan, calls, ranks)
