"""Sequence parallel on two CPU ranks (gloo): each rank's attention sees half of the token
sequence and the output equals one rank's (<= 1e-3, fp32). Ulysses for Z-Image, Wan and the
joint text+image attention of Qwen-Image, FLUX (and Kontext, its input image's tokens too) and
FLUX.2-klein; ring attention for Z-Image and Wan; a
batch whose requests are at different steps (as step mode runs them) and, for Z-Image, of
different caption lengths (a padding mask) too. One spawned pair of ranks runs every check."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.registry import pipeline_class
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

from two_ranks import run_two_ranks
from parity import request_for

FAMILIES = {  # zoo name -> diffusers class name
    "z-image": "ZImagePipeline",
    "wan-t2v": "WanPipeline",
    "qwen-image": "QwenImagePipeline",
    "flux": "FluxPipeline",
    "flux-kontext": "FluxKontextPipeline",
    "flux2-klein": "Flux2KleinPipeline",
}
TOLERANCE = 1e-3
ULYSSES_2 = dict(executor="mp", num_devices=2, ulysses_degree=2)
RING_2 = dict(executor="mp", num_devices=2, ring_degree=2)
RING_FAMILIES = ("z-image", "wan-t2v")


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


def staggered(pipeline, name: str) -> list[np.ndarray]:
    """Two requests in one batch, the second joining after the first's first step (step mode)."""
    first = pipeline.encode([pipeline.prepare_request(
        request_for(call_kwargs(name, num_inference_steps=3), seed=1, request_id="a"))])
    pipeline.denoise_step(first)
    # A caption past 32 tokens: Z-Image pads the two requests to different lengths (a mask).
    long_prompt = call_kwargs(name, prompt="a small brown dog " * 8)
    second = pipeline.encode([pipeline.prepare_request(request_for(long_prompt, seed=2, request_id="b"))])
    states = first + second
    while running := [s for s in states if not s.is_done]:
        pipeline.denoise_step(running)
    return pipeline.decode_arrays(states)


def run_checks(name: str, path: str, deploy: StageDeployConfig | None) -> dict[str, np.ndarray | list]:
    pipeline = load(name, path, deploy)
    assert pipeline.accelerations == (["sequence_parallel"] if deploy is not None else [])
    seen = attention_lengths(pipeline)
    (alone,) = pipeline.decode_arrays(pipeline.denoise([request_for(call_kwargs(name), seed=4)]))
    out = {"alone": alone, "lengths": sorted(set(seen))}
    if name in ("z-image", "wan-t2v"):
        out["staggered"] = staggered(pipeline, name)
    return out


def _rank_main(rank: int, port: int, paths: dict[str, str], out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    deploy = StageDeployConfig(**ULYSSES_2)
    results = {}
    for name, path in paths.items():
        results[name] = run_checks(name, path, deploy)
    for name in RING_FAMILIES:
        results[f"ring {name}"] = run_checks(name, paths[name], StageDeployConfig(**RING_2))
    # A text length the degree does not divide fails the request, naming both numbers.
    qwen = load("qwen-image", paths["qwen-image"], deploy)
    odd = next(p for p in ("a", "a cat", "a red cat", "one red cat sat") if
               len(qwen._encode_prompts([p], [])[0]) % 2)
    try:
        qwen.denoise([request_for(call_kwargs("qwen-image", prompt=odd, negative_prompt=None), seed=4)])
        results["odd_text"] = "no error"
    except ValueError as e:
        results["odd_text"] = str(e)
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
    return {name: run_checks(name, str(zoo(name)), None) for name in FAMILIES}


@pytest.mark.parametrize("name", list(FAMILIES) + [f"ring {name}" for name in RING_FAMILIES])
def test_sequence_parallel_equals_one_rank_with_half_the_sequence_per_rank(one_thread, two_rank_results,
                                                                           one_rank_results, name):
    one_rank = one_rank_results[name.removeprefix("ring ")]
    two = two_rank_results[name]
    assert two["lengths"] == [n // 2 for n in one_rank["lengths"]]  # the split really happened
    assert np.abs(two["alone"] - one_rank["alone"]).max() <= TOLERANCE
    for a, b in zip(two.get("staggered", []), one_rank.get("staggered", []), strict=True):
        assert np.abs(a - b).max() <= TOLERANCE


def test_a_token_count_the_degree_does_not_divide_fails_naming_both(two_rank_results):
    assert two_rank_results["odd_text"].startswith("ulysses_degree=2 does not divide the ")
    assert "text tokens of this request" in two_rank_results["odd_text"]


def test_refusals_name_the_family_and_numbers(zoo):
    with pytest.raises(ValueError, match=r"ulysses_degree=2: StableDiffusion3Pipeline cannot take it: "
                                         "its joint attention processor calls SDPA directly"):
        pipeline_class("StableDiffusion3Pipeline").from_pretrained(str(zoo("sd3")),
                                                                   deploy=StageDeployConfig(**ULYSSES_2))
    heads = load("wan-t2v", str(zoo("wan-t2v"))).transformer.config.num_attention_heads
    degree = next(d for d in range(2, 9) if heads % d)
    with pytest.raises(ValueError, match=f"ulysses_degree={degree} does not divide the {heads} attention heads "
                                         "of WanPipeline"):
        load("wan-t2v", str(zoo("wan-t2v")), StageDeployConfig(executor="mp", num_devices=degree,
                                                               ulysses_degree=degree))
    with pytest.raises(ValueError, match=r"ring_degree=2: QwenImagePipeline cannot take it: "
                                         "its joint-attention processor has no ring version here"):
        load("qwen-image", str(zoo("qwen-image")), StageDeployConfig(**RING_2))
    with pytest.raises(ValueError, match="ulysses_degree=2 needs executor 'mp' with num_devices=2"):
        load("z-image", str(zoo("z-image")), StageDeployConfig(**ULYSSES_2))
