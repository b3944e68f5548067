"""Sequence parallel on two CPU ranks (gloo): each rank's attention sees half of the token
sequence and the output equals one rank's (<= 1e-3, fp32). Ulysses for Z-Image, Wan and the
joint text+image attention of Qwen-Image, FLUX (and Kontext, its input image's tokens too) and
FLUX.2-klein; ring attention for Z-Image and Wan; a
batch whose requests are at different steps (as step mode runs them) and, for Z-Image and
Qwen-Image, of different prompt lengths (a padding mask) too. Token counts 2 does not divide
(Qwen-Image's text, FLUX's and SD3's image) are padded and masked, and equal one rank as well.
Ring for the joint-attention families is in test_declared_accelerations.py. One spawned pair of
ranks runs every check; four ranks run Ulysses x ring on Qwen-Image's padded 59-token prompt."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.registry import pipeline_class
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

from two_ranks import rank_results, run_ranks, run_two_ranks, save_rank_results
from parity import request_for

FAMILIES = {  # zoo name -> diffusers class name
    "z-image": "ZImagePipeline",
    "wan-t2v": "WanPipeline",
    "qwen-image": "QwenImagePipeline",
    "flux": "FluxPipeline",
    "flux-kontext": "FluxKontextPipeline",
    "flux2-klein": "Flux2KleinPipeline",
    "sd3": "StableDiffusion3Pipeline",
}
TOLERANCE = 1e-3
TIGHT = 2e-5
"""Ulysses without ring matches one rank to float rounding: tight, as a padding key left unmasked
moves Qwen-Image's pixels by only ~3e-4 (ring's online softmax rounds more: TOLERANCE)."""
ULYSSES_2 = dict(executor="mp", num_devices=2, ulysses_degree=2)
RING_2 = dict(executor="mp", num_devices=2, ring_degree=2)
RING_FAMILIES = ("z-image", "wan-t2v")
PADDED = {  # label -> (zoo name, degree, call overrides): a token count 2 does not divide
    "odd text qwen-image": ("qwen-image", ULYSSES_2, {"prompt": "a red fox", "negative_prompt": None}),
    "odd image flux": ("flux", ULYSSES_2, {"height": 48, "width": 48}),  # 3 x 3 image tokens
    "odd image sd3 ring": ("sd3", RING_2, {"height": 48, "width": 48}),
}
STAGGERED = {  # zoo name -> the second request's prompt
    "z-image": "a small brown dog " * 8,  # a caption past 32 tokens: Z-Image pads the two to different lengths
    "wan-t2v": "a small brown dog " * 8,
    "qwen-image": "a red fox",  # 59 text tokens to the first's 64: Qwen-Image batches them under a prompt mask
}


def call_kwargs(name: str, **overrides) -> dict:
    call = {**zoo_call_kwargs(name), "num_inference_steps": 2, **overrides}
    if name == "flux-kontext":  # our request: the size asked for, auto_resize an extra, the image's tokens split too
        call.pop("max_area")
        call["auto_resize"] = call.pop("_auto_resize")
        call["image"] = default_input_image()
    return call


def load(name: str, path: str, deploy: StageDeployConfig | None = None):
    return pipeline_class(FAMILIES[name]).from_pretrained(path, deploy=deploy)


def attention_lengths(pipeline) -> list[int]:
    """Records the sequence length each call of the transformer's last attention module sees."""
    seen: list[int] = []
    attention = [m for m in pipeline.transformer.modules() if hasattr(m, "processor") and hasattr(m, "heads")][-1]
    attention.register_forward_pre_hook(lambda module, args, kwargs: seen.append(
        (args[0] if args else kwargs["hidden_states"]).shape[1]), with_kwargs=True)
    return seen


def token_counts(pipeline) -> list[int]:
    """Records the token counts (text, image) each transformer call splits, as its plan counts them."""
    seen: list[int] = []
    lengths = pipeline.supported_accelerations.sequence_parallel.split_lengths
    pipeline.transformer.register_forward_pre_hook(
        lambda model, args, kwargs: seen.extend(lengths(model, kwargs).values()), with_kwargs=True)
    return seen


def staggered(pipeline, name: str) -> list[np.ndarray]:
    """Two requests in one batch, the second joining after the first's first step (step mode)."""
    first = pipeline.encode([pipeline.prepare_request(
        request_for(call_kwargs(name, num_inference_steps=3), seed=1, request_id="a"))])
    pipeline.denoise_step(first)
    second_call = call_kwargs(name, prompt=STAGGERED[name])
    second = pipeline.encode([pipeline.prepare_request(request_for(second_call, seed=2, request_id="b"))])
    states = first + second
    while running := [s for s in states if not s.is_done]:
        pipeline.denoise_step(running)
    return pipeline.decode_arrays(states)


def run_checks(name: str, path: str, deploy: StageDeployConfig | None, staggered_too: bool = False,
               **overrides) -> dict[str, np.ndarray | list]:
    pipeline = load(name, path, deploy)
    assert pipeline.accelerations == (["sequence_parallel"] if deploy is not None else [])
    seen = attention_lengths(pipeline)
    counts = token_counts(pipeline)
    (alone,) = pipeline.decode_arrays(pipeline.denoise([request_for(call_kwargs(name, **overrides), seed=4)]))
    out = {"alone": alone, "lengths": sorted(set(seen)), "counts": counts}
    if staggered_too:
        out["staggered"] = staggered(pipeline, name)
    return out


def _rank_main(rank: int, port: int, paths: dict[str, str], out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    deploy = StageDeployConfig(**ULYSSES_2)
    results = {}
    for name, path in paths.items():
        results[name] = run_checks(name, path, deploy, name in STAGGERED)
    for name in RING_FAMILIES:
        results[f"ring {name}"] = run_checks(name, paths[name], StageDeployConfig(**RING_2), name in STAGGERED)
    for label, (name, fields, overrides) in PADDED.items():
        results[label] = run_checks(name, paths[name], StageDeployConfig(**fields), **overrides)
    # A family that does not pad (Wan: 3 frames x 3 x 3 latent patches) fails such a request, naming both numbers.
    wan = load("wan-t2v", paths["wan-t2v"], deploy)
    try:
        wan.denoise([request_for(call_kwargs("wan-t2v", height=48, width=48), seed=4)])
        results["odd_tokens"] = "no error"
    except ValueError as e:
        results["odd_tokens"] = str(e)
    if rank == 0:
        torch.save(results, os.path.join(out_dir, "results.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results(zoo, tmp_path_factory):
    paths = {name: str(zoo(name)) for name in FAMILIES}
    out_dir = str(tmp_path_factory.mktemp("sequence_parallel"))
    run_two_ranks(_rank_main, paths, out_dir, timeout=400)
    return torch.load(os.path.join(out_dir, "results.pt"), weights_only=False)


@pytest.fixture(scope="module")
def one_rank_results(zoo):
    results = {name: run_checks(name, str(zoo(name)), None, name in STAGGERED) for name in FAMILIES}
    for label, (name, _, overrides) in PADDED.items():
        results[label] = run_checks(name, str(zoo(name)), None, **overrides)
    return results


@pytest.mark.parametrize("name", list(FAMILIES) + [f"ring {name}" for name in RING_FAMILIES])
def test_sequence_parallel_equals_one_rank_with_half_the_sequence_per_rank(one_thread, two_rank_results,
                                                                           one_rank_results, name):
    one_rank = one_rank_results[name.removeprefix("ring ")]
    two = two_rank_results[name]
    assert two["lengths"] == [n // 2 for n in one_rank["lengths"]]  # the split really happened
    tolerance = TOLERANCE if name.startswith("ring ") else TIGHT
    assert np.abs(two["alone"] - one_rank["alone"]).max() <= tolerance
    for a, b in zip(two.get("staggered", []), one_rank.get("staggered", []), strict=True):
        assert np.abs(a - b).max() <= tolerance


@pytest.mark.parametrize("label", list(PADDED))
def test_token_counts_the_degree_does_not_divide_are_padded_and_equal_one_rank(two_rank_results, one_rank_results,
                                                                               label):
    one_rank, two = one_rank_results[label], two_rank_results[label]
    assert any(n % 2 for n in one_rank["counts"])  # the request really has an odd count
    assert two["counts"] == one_rank["counts"]
    # Half of each split sequence per rank, plus its padding row where the count is odd.
    assert all(0 <= 2 * half - n <= 2 for half, n in zip(two["lengths"], one_rank["lengths"], strict=True))
    assert np.abs(two["alone"] - one_rank["alone"]).max() <= (TOLERANCE if "ring" in label else TIGHT)


HYBRID = dict(executor="mp", num_devices=4, ulysses_degree=2, ring_degree=2)
HYBRID_CASE = ("qwen-image", {"prompt": "a red fox", "negative_prompt": None})
"""Ulysses x ring on four ranks: heads exchanged within each pair, key/value chunks passed around
the two pairs; the 59 text tokens, which 4 does not divide, padded."""


def _hybrid_rank_main(rank: int, port: int, path: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    name, overrides = HYBRID_CASE
    save_rank_results(out_dir, rank, run_checks(name, path, StageDeployConfig(**HYBRID), **overrides))
    dist.destroy_process_group()


def test_ulysses_by_ring_hybrid_on_four_ranks_equals_one_rank(one_thread, zoo, tmp_path):
    name, overrides = HYBRID_CASE
    run_ranks(4, _hybrid_rank_main, str(zoo(name)), str(tmp_path), timeout=300)
    one_rank = run_checks(name, str(zoo(name)), None, **overrides)
    assert any(n % 4 for n in one_rank["counts"])  # padded
    for four in rank_results(tmp_path, 4):
        assert four["counts"] == one_rank["counts"]
        assert four["lengths"] == [n // 4 for n in one_rank["lengths"]]  # a quarter of the image tokens each
        assert np.abs(four["alone"] - one_rank["alone"]).max() <= TOLERANCE


def test_a_family_that_does_not_pad_fails_an_odd_token_count_naming_both(two_rank_results):
    assert two_rank_results["odd_tokens"] == "ulysses_degree=2 does not divide the 27 video tokens of this request"


def test_refusals_name_the_family_and_numbers(zoo):
    heads = load("wan-t2v", str(zoo("wan-t2v"))).transformer.config.num_attention_heads
    degree = next(d for d in range(2, 9) if heads % d)
    with pytest.raises(ValueError, match=f"ulysses_degree={degree} does not divide the {heads} attention heads "
                                         "of WanPipeline"):
        load("wan-t2v", str(zoo("wan-t2v")), StageDeployConfig(executor="mp", num_devices=degree,
                                                               ulysses_degree=degree))
    with pytest.raises(ValueError, match="ulysses_degree=2 needs executor 'mp' with num_devices=2"):
        load("z-image", str(zoo("z-image")), StageDeployConfig(**ULYSSES_2))
