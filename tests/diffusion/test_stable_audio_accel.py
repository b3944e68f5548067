"""Stable Audio with the accelerations of diffusion/accel/: the step caches (threshold 0 is the
uncached output bit for bit, a high one skips forwards, a request's result is the same alone
or joined by another at other steps), CFG parallel on two gloo ranks, the Oobleck VAE's own
tiling, int8 weights, model offload, and the ones it cannot take refused by name (sequence
and VAE-patch parallel, attention backends, LoRA, regional compile)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.accel import attention_backend, lora, sequence_parallel, vae_patch_parallel
from omnistage.diffusion.accel import compile as regional_compile
from omnistage.models.stable_audio.pipeline import StableAudio
from omnistage.testing import call_kwargs as zoo_call_kwargs

from parity import BATCH_PROMPTS, request_for
from two_ranks import run_two_ranks

STEPS = 6
THRESHOLD = {"first_block_cache": "threshold", "tea_cache": "rel_l1_thresh"}


def load(path, **deploy_fields) -> StableAudio:
    return StableAudio.from_pretrained(str(path), deploy=StageDeployConfig(**deploy_fields))


def call(**overrides) -> dict:
    return {**zoo_call_kwargs("stable-audio"), "num_inference_steps": STEPS, **overrides}


def run(pipeline: StableAudio, seed: int = 3, **overrides) -> tuple[np.ndarray, dict]:
    (state,) = pipeline.denoise([request_for(call(**overrides), seed=seed)])
    (arr,) = pipeline.decode_arrays([state])
    return arr, pipeline.state_metrics(state)


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("stable-audio")


@pytest.fixture(scope="module")
def plain(path):
    return load(path)


@pytest.fixture(scope="module")
def uncached(plain):
    return run(plain)


@pytest.mark.parametrize("backend", list(THRESHOLD))
def test_step_cache_threshold_zero_is_exact_and_a_high_one_skips(path, uncached, backend):
    arr, metrics = run(load(path, cache_backend=backend, cache_config={THRESHOLD[backend]: 0.0}))
    assert np.array_equal(arr, uncached[0]) and metrics["num_forwards_skipped"] == 0
    assert metrics["num_forwards_computed"] == uncached[1]["num_forwards_computed"] == 2 * STEPS  # cond + uncond
    arr, metrics = run(load(path, cache_backend=backend, cache_config={THRESHOLD[backend]: 10.0}))
    assert metrics["num_forwards_skipped"] > 0 and arr.shape == uncached[0].shape


def test_first_block_cache_alone_equals_joined_at_other_steps(path):
    pipeline = load(path, cache_backend="first_block_cache", cache_config={"threshold": 0.3})
    first = request_for(call(prompt=BATCH_PROMPTS[0]), 11, "a")
    second = request_for(call(prompt=BATCH_PROMPTS[1]), 22, "b")
    alone = [pipeline.denoise([r])[0] for r in (first, second)]
    states = pipeline.encode([pipeline.prepare_request(first)])
    for _ in range(2):
        pipeline.denoise_step(states)
    states += pipeline.encode([pipeline.prepare_request(second)])
    while any(not s.is_done for s in states):
        pipeline.denoise_step([s for s in states if not s.is_done])
    for got, want in zip(pipeline.decode_arrays(states), pipeline.decode_arrays(alone)):
        assert np.abs(got - want).max() <= 1e-4
    assert [pipeline.state_metrics(s) for s in states] == [pipeline.state_metrics(s) for s in alone]


def _cfg_rank_main(rank: int, port: int, path: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    pipeline = load(path, executor="mp", num_devices=2, cfg_parallel_size=2)
    assert pipeline.accelerations == ["cfg_parallel"]
    arr, _ = run(pipeline, num_inference_steps=3)
    if rank == 0:
        np.save(os.path.join(out_dir, "audio.npy"), arr)
    dist.destroy_process_group()


def test_cfg_parallel_on_two_ranks_equals_one(path, plain, one_thread, tmp_path):
    run_two_ranks(_cfg_rank_main, str(path), str(tmp_path), timeout=300)
    want, _ = run(plain, num_inference_steps=3)
    assert np.abs(np.load(tmp_path / "audio.npy") - want).max() <= 1e-4


def test_vae_tiling_decodes_in_time_tiles_close_to_whole(path, plain):
    tiled = load(path, vae_use_tiling=True)
    assert tiled.accelerations == ["vae_tiling"] and tiled.vae.use_tiling
    # The default tiles (512 latent frames) exceed the tiny window: make them smaller than it.
    tiled.vae.tile_latent_min_length, tiled.vae.tile_latent_overlap = 64, 16
    latents = torch.randn(1, tiled.vae.config.decoder_input_channels, tiled.sample_size,
                          generator=torch.Generator().manual_seed(0))
    whole = plain.vae.decode(latents).sample
    got = tiled.vae.decode(latents).sample
    assert got.shape == whole.shape and torch.abs(got - whole).max() <= 1e-3 * max(1.0, whole.abs().max())


def test_int8_quantization_stays_close(path, uncached):
    pipeline = load(path, quantization="int8")
    assert pipeline.accelerations == ["quantization"]
    arr, _ = run(pipeline)
    want = uncached[0]
    diff = np.abs(arr - want).max()
    assert np.isfinite(arr).all() and 0 < diff <= 0.05 * np.abs(want).max()  # rounded weights, close output


def test_model_offload_gives_the_same_audio(path, uncached):
    arr, _ = run(load(path, offload="model"))
    assert np.array_equal(arr, uncached[0])


@pytest.mark.parametrize("module, fields, message", [
    (sequence_parallel, dict(executor="mp", num_devices=2, ulysses_degree=2), "declares no sequence-parallel plan"),
    (vae_patch_parallel, dict(executor="mp", num_devices=2, cfg_parallel_size=2, vae_patch_parallel_size=2),
     "does not declare vae_patch_parallel"),
    (attention_backend, dict(attention_backend="sdpa_math"), "does not go through"),
    (lora, dict(lora=[{"path": "/nowhere/adapter.safetensors", "scale": 1.0}]), "lora"),
    (regional_compile, dict(compile=True), "declares its repeated blocks"),
])
def test_unsupported_accelerations_are_refused_by_name(plain, module, fields, message):
    with pytest.raises(ValueError, match=message):
        module.apply(plain, module.from_deploy(StageDeployConfig(**fields)))
