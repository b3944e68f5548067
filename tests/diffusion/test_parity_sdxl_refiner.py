"""SDXL base + refiner (diffusers' ensemble of experts): our two stages against diffusers'
StableDiffusionXLPipeline(denoising_end, output_type="latent") then
StableDiffusionXLImg2ImgPipeline(image=those latents, denoising_start) on the tiny zoo models
(fp32, CPU), alone, two in a batch and staggered in step mode; and the `sdxl_refiner` deploy
file selecting the two stages over a pipeline folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from parity import (BATCH_PROMPTS, BATCH_SEEDS, TOLERANCE, assert_all_close, load_reference, max_abs_diff, request_for,
                    run_staggered)

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.sdxl.pipeline import StableDiffusionXL
from omnistage.models.sdxl.refiner import StableDiffusionXLRefiner
from omnistage.testing import call_kwargs
from omnistage.testing.sdxl_models import ENSEMBLE_SPLIT

SPLIT = {"denoising_end": ENSEMBLE_SPLIT}


@pytest.fixture(scope="module")
def paths(zoo):
    return zoo("sdxl"), zoo("sdxl-refiner")


@pytest.fixture(scope="module")
def ours(paths):
    return StableDiffusionXL.from_pretrained(paths[0]), StableDiffusionXLRefiner.from_pretrained(paths[1])


@pytest.fixture(scope="module")
def expected(paths):
    """`get(call, seed)`: diffusers' ensemble output, computed once per (prompt, seed, steps, n)."""
    from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline

    base = load_reference(StableDiffusionXLPipeline, paths[0])
    refiner = load_reference(StableDiffusionXLImg2ImgPipeline, paths[1])
    cache = {}

    def get(call: dict, seed: int) -> np.ndarray:
        key = (call["prompt"], seed, call["num_inference_steps"], call.get("num_images_per_prompt", 1))
        if key not in cache:
            latents = base(**call, **SPLIT, output_type="latent",
                           generator=torch.Generator("cpu").manual_seed(seed)).images
            cache[key] = refiner(**_refiner_call(call), image=latents, denoising_start=ENSEMBLE_SPLIT, output_type="np",
                                 generator=torch.Generator("cpu").manual_seed(seed)).images
        return cache[key]

    return get


def _refiner_call(call: dict) -> dict:
    # The refiner reads the size from the latents.
    return {k: v for k, v in call.items() if k not in ("height", "width")}


def _ensemble(ours, calls: list[dict], seeds: list[int]) -> list:
    """Our base on every call in one batch, then our refiner's requests on its latents."""
    base, refiner = ours
    states = base.denoise([request_for({**c, **SPLIT}, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, seeds))])
    return [_refiner_request(c, s, state.latents, f"r{i}")
            for i, (c, s, state) in enumerate(zip(calls, seeds, states))]


def _refiner_request(call: dict, seed: int, latents, request_id: str) -> DiffusionRequest:
    request = request_for({**_refiner_call(call), "denoising_start": ENSEMBLE_SPLIT}, seed, request_id)
    request.condition["latents"] = latents
    return request


CALL = call_kwargs("sdxl")


def test_alone_matches_diffusers(ours, expected):
    call = dict(CALL, prompt=BATCH_PROMPTS[0])
    (request,) = _ensemble(ours, [call], [BATCH_SEEDS[0]])
    (got,) = ours[1].decode_arrays(ours[1].denoise([request]))
    assert max_abs_diff(got, expected(call, BATCH_SEEDS[0])) <= TOLERANCE


def test_batch_of_two_matches_each_alone(ours, expected):
    calls = [dict(CALL, prompt=BATCH_PROMPTS[0]), dict(CALL, prompt=BATCH_PROMPTS[1], num_images_per_prompt=2)]
    requests = _ensemble(ours, calls, BATCH_SEEDS[:2])
    got = ours[1].decode_arrays(ours[1].denoise(requests))
    assert_all_close(got, [expected(c, s) for c, s in zip(calls, BATCH_SEEDS)])
    assert max_abs_diff(got[0], got[1][:1]) > 1e-2


def test_staggered_refiner_requests_share_steps(ours, expected):
    # A 4-step ensemble's refiner runs alone for a step, then an 8-step one's joins.
    long_call = dict(CALL, prompt=BATCH_PROMPTS[0], num_inference_steps=8)
    short_call = dict(CALL, prompt=BATCH_PROMPTS[1])
    first, second = _ensemble(ours, [short_call, long_call], BATCH_SEEDS[:2])
    got = run_staggered(ours[1], first, second, join_after=1)
    assert_all_close(got, [expected(short_call, BATCH_SEEDS[0]), expected(long_call, BATCH_SEEDS[1])])


def test_the_base_hands_on_latents_only_when_asked(ours):
    from omnistage.core.types import ImagePayload

    base = ours[0]
    request = request_for({**CALL, **SPLIT, "num_inference_steps": 2}, 0)
    assert isinstance(base.forward([request])[0], ImagePayload)
    request.condition["output"] = "latents"
    (payload,) = base.forward([request])
    assert payload.latents.shape == (1, 4, 8, 8) and payload.extras == SPLIT


@pytest.mark.parametrize("condition, extras, field", [
    ({}, {"denoising_start": 0.5}, "condition"),
    ({"latents": torch.zeros(1, 4, 8, 8)}, {}, "denoising_start"),
    ({"latents": torch.zeros(1, 4, 8, 8)}, {"denoising_start": 0.5, "denoising_end": 0.5}, "denoising_end"),
])
def test_refiner_bad_inputs_are_rejected(ours, condition, extras, field):
    request = DiffusionRequest("r", "a cat", DiffusionParams(extras=extras), condition=condition)
    with pytest.raises(ValueError, match=field):
        ours[1].prepare_request(request)


def test_the_deploy_file_selects_base_then_refiner(paths, tmp_path):
    from omnistage.config.effective import resolve_config
    from omnistage.engine.factory import stage_model_paths

    folder = tmp_path / "ensemble"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "sdxl_refiner", "stage_models": {
        "base": str(paths[0]), "refiner": str(paths[1])}}))
    config = resolve_config(folder)
    assert [(s.name, s.model, s.output) for s in config.pipeline.stages] == [
        ("base", "StableDiffusionXLPipeline", "latent"), ("refiner", "StableDiffusionXLImg2ImgPipeline", "image")]
    assert [config.stage_config(i).default_sampling_params["extras"] for i in (0, 1)] == [
        {"denoising_end": 0.8}, {"denoising_start": 0.8}]
    assert stage_model_paths(str(folder), config.pipeline) == {0: str(paths[0]), 1: str(paths[1])}
