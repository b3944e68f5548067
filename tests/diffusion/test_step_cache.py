"""Step caches (first_block_cache, tea_cache) on the tiny zoo checkpoints of every native
family: threshold 0 is the uncached output bit for bit, higher thresholds skip more
forwards, a request's output and skip count are the same alone or batched with requests at
other steps (step mode), and bad settings are refused naming the field."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.accel import check_supported
from omnistage.diffusion.registry import pipeline_class
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

from parity import BATCH_PROMPTS, BATCH_SEEDS, request_for

FAMILIES = {  # zoo name -> diffusers class name
    "z-image": "ZImagePipeline",
    "qwen-image": "QwenImagePipeline",
    "qwen-image-edit": "QwenImageEditPipeline",
    "flux": "FluxPipeline",
    "flux-kontext": "FluxKontextPipeline",
    "ovis-image": "OvisImagePipeline",
    "krea2": "Krea2Pipeline",
    "longcat-image": "LongCatImagePipeline",
    "sd3": "StableDiffusion3Pipeline",
    "wan-t2v": "WanPipeline",
}
THRESHOLD = {"first_block_cache": "threshold", "tea_cache": "rel_l1_thresh"}
STEPS = 6
THRESHOLD_STEPS = 4
"""Enough for the per-family threshold test: after the one warm-up step a high threshold skips the
rest, and a zero one must compute them all (20 families x caches: steps are most of its time)."""


def call_kwargs(name: str, **overrides) -> dict:
    call = {**zoo_call_kwargs(name), "num_inference_steps": STEPS, **overrides}
    if name == "qwen-image-edit":
        call.pop("max_sequence_length")
        call["image"] = default_input_image()
    if name == "flux-kontext":  # our request: the size asked for, auto_resize as an extra
        call.pop("max_area")
        call["auto_resize"] = call.pop("_auto_resize")
        call["image"] = default_input_image()
    return call


def load(zoo, name: str, backend: str | None = None, threshold: float | None = None, **fields):
    config = {} if backend is None else {THRESHOLD[backend]: threshold}
    deploy = StageDeployConfig(cache_backend=backend, cache_config=config, **fields)
    return pipeline_class(FAMILIES[name]).from_pretrained(str(zoo(name)), deploy=deploy)


def run(pipeline, name: str, seed: int = 3, **overrides):
    """(float output, metrics) of one request run alone."""
    (state,) = pipeline.denoise([request_for(call_kwargs(name, **overrides), seed=seed)])
    (arr,) = pipeline.decode_arrays([state])
    return arr, pipeline.state_metrics(state)


def alone_and_staggered(pipeline, requests: list, join_after: int) -> tuple[list, list, int]:
    """Each request's (output, metrics) run alone, then both in step mode with the second joining
    after `join_after` steps of the first (every later call mixes requests at different steps);
    with the number of calls the step cache had to split in the staggered run."""
    alone = []
    for request in requests:
        (state,) = pipeline.denoise([request])
        alone.append((pipeline.decode_arrays([state])[0], pipeline.state_metrics(state)))
    splits_before = pipeline.step_cache.num_split_calls
    states = pipeline.encode([pipeline.prepare_request(requests[0])])
    for _ in range(join_after):
        pipeline.denoise_step(states)
    states += pipeline.encode([pipeline.prepare_request(requests[1])])
    while any(not s.is_done for s in states):
        pipeline.denoise_step([s for s in states if not s.is_done])
    staggered = [(arr, pipeline.state_metrics(s)) for s, arr in zip(states, pipeline.decode_arrays(states))]
    return alone, staggered, pipeline.step_cache.num_split_calls - splits_before


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Of outputs in [0, 1]."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)

@pytest.fixture(scope="module")
def uncached(zoo):
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = run(load(zoo, name), name, num_inference_steps=THRESHOLD_STEPS)
        return cache[name]

    return get


@pytest.mark.parametrize("backend", list(THRESHOLD))
@pytest.mark.parametrize("name", list(FAMILIES))
def test_threshold_zero_is_bit_identical_and_a_high_one_skips(zoo, uncached, name, backend):
    base, base_metrics = uncached(name)
    pipeline = load(zoo, name, backend, 0.0)
    assert pipeline.accelerations == [backend]
    arr, metrics = run(pipeline, name, num_inference_steps=THRESHOLD_STEPS)
    assert np.array_equal(arr, base)
    assert metrics == base_metrics and metrics["num_forwards_skipped"] == 0

    arr, metrics = run(load(zoo, name, backend, 100.0), name, num_inference_steps=THRESHOLD_STEPS)
    total = base_metrics["num_forwards_computed"]
    assert metrics["num_forwards_computed"] + metrics["num_forwards_skipped"] == total
    assert metrics["num_forwards_skipped"] > 0
    assert not np.array_equal(arr, base)


@pytest.mark.parametrize("backend", list(THRESHOLD))
def test_skipped_forwards_rise_with_the_threshold(zoo, backend):
    skipped = [run(load(zoo, "qwen-image", backend, t), "qwen-image", num_inference_steps=12)[1]
               ["num_forwards_skipped"] for t in (0.0, 0.05, 0.2, 0.8, 3.0)]
    assert skipped == sorted(skipped) and skipped[0] == 0 and skipped[-1] > skipped[1]


@pytest.mark.parametrize(("name", "backend", "threshold"), [
    ("qwen-image", "first_block_cache", 0.5),  # one call per branch
    ("z-image", "tea_cache", 0.4),  # cond and uncond rows in one call, rows padded to the longest
    ("sd3", "first_block_cache", 0.4),
    ("flux-kontext", "tea_cache", 0.4),  # the input image's tokens ride along in every block
    ("krea2", "first_block_cache", 0.4),  # text rows of different real lengths, masked
])
def test_alone_equals_batched_at_other_steps(zoo, name, backend, threshold):
    pipeline = load(zoo, name, backend, threshold)
    requests = [request_for(call_kwargs(name, prompt=BATCH_PROMPTS[i]), seed=BATCH_SEEDS[i], request_id=f"r{i}")
                for i in range(2)]
    alone, batched, splits = alone_and_staggered(pipeline, requests, join_after=1)
    assert splits > 0  # some calls had to split
    for (arr, metrics), (arr_alone, metrics_alone) in zip(batched, alone):
        assert metrics == metrics_alone and metrics["num_forwards_skipped"] > 0
        assert np.abs(arr - arr_alone).max() <= 1e-3


@pytest.mark.parametrize("backend", list(THRESHOLD))
def test_caches_compose_with_layerwise_offload(zoo, backend):
    """Offload's group hooks and the caches' hooks sit on the same blocks (caches first)."""
    # Offload leaves the linears unpacked (accel/prepack.py), so does the run it equals.
    alone = run(load(zoo, "qwen-image", backend, 0.5, prepack_linears=False), "qwen-image")
    deploy = StageDeployConfig(cache_backend=backend, cache_config={THRESHOLD[backend]: 0.5}, offload="layerwise")
    pipeline = pipeline_class(FAMILIES["qwen-image"]).from_pretrained(str(zoo("qwen-image")), deploy=deploy)
    assert pipeline.accelerations == [backend, "offload"]
    arr, metrics = run(pipeline, "qwen-image")
    assert np.array_equal(arr, alone[0]) and metrics == alone[1] and metrics["num_forwards_skipped"] > 0


def test_omni_cache_backend_reports_forwards_in_metrics_and_prometheus(zoo):
    """The user's path: Omni(..., cache_backend=..., cache_config=...) on Z-Image in step mode;
    each output's stage metrics count its forwards, /metrics exports the totals."""
    from prometheus_client import generate_latest

    from omnistage import DiffusionParams, Omni

    params = DiffusionParams(num_inference_steps=8, height=32, width=32, guidance_scale=3.0, seed=3,
                             extras={"max_sequence_length": 32})
    with Omni(zoo("z-image"), cache_backend="tea_cache", cache_config={"rel_l1_thresh": 0.8},
              step_execution=True) as omni:
        outs = omni.generate(["a cat", "a dog"], params, use_tqdm=False)
        exported = generate_latest(omni.async_omni.metrics_registry).decode()
    stages = [o.metrics["stages"]["diffusion"] for o in outs]
    for stage in stages:
        assert stage["num_forwards_computed"] + stage["num_forwards_skipped"] == 16  # 8 steps x 2 branches
        assert stage["num_forwards_skipped"] > 0
    skipped = sum(s["num_forwards_skipped"] for s in stages)
    assert f'omnistage_stage_transformer_forwards_skipped_total{{pipeline="z_image",stage="diffusion"}} ' \
           f'{float(skipped)}' in exported


@pytest.mark.parametrize(("fields", "message"), [
    ({"cache_backend": "tea"}, "cache_backend must be one of"),
    ({"cache_config": {"threshold": 0.1}}, "cache_config is set but cache_backend is not"),
    ({"cache_backend": "first_block_cache", "cache_config": {"thresh": 0.1}}, r"cache_config\.thresh: not an option"),
    ({"cache_backend": "first_block_cache", "cache_config": {"threshold": -1}}, r"cache_config\.threshold: must be >= 0"),
    ({"cache_backend": "first_block_cache", "cache_config": {"warmup_steps": 1.5}},
     r"cache_config\.warmup_steps: must be an int"),
    ({"cache_backend": "tea_cache", "cache_config": {"rel_l1_thresh": "high"}},
     r"cache_config\.rel_l1_thresh: must be a float"),
    ({"cache_backend": "tea_cache", "cache_config": {"rel_l1_thresh": True}},
     r"cache_config\.rel_l1_thresh: must be a float"),
])
def test_bad_cache_settings_are_refused_before_loading(fields, message):
    with pytest.raises(ValueError, match=message):
        check_supported("0 (diffusion)", StageDeployConfig(**fields))


def test_good_cache_settings_pass():
    check_supported("0", StageDeployConfig(cache_backend="tea_cache", cache_config={"rel_l1_thresh": 1}))
    check_supported("0", StageDeployConfig(cache_backend="first_block_cache"))
