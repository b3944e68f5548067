"""LTX-2 with the accelerations of accel/: what works (model offload, VAE tiling, per-request
LoRA: each as diffusers gives it), what it refuses by name at load (CFG-parallel, sequence
parallel and the step caches hook the shared guidance seam and block chains, which its
multi-pass audio-video guidance does not use), and step mode through the engine."""

from __future__ import annotations

import numpy as np
import pytest

from parity import TOLERANCE, load_reference, max_abs_diff

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.ltx2.pipeline import LTX2T2V

# A short run with every guidance pass on (STG on the zoo transformer's last block).
PARAMS = DiffusionParams(seed=3, negative_prompt="blurry", height=64, width=64, num_frames=9, fps=24.0,
                         num_inference_steps=2, extras={"max_sequence_length": 32, "stg_block": 1})


def run(pipeline: LTX2T2V) -> tuple[np.ndarray, np.ndarray]:
    (video, audio), = pipeline.decode_av(pipeline.denoise([DiffusionRequest("r", "a cat", PARAMS)]))
    return video, audio


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("ltx2")


@pytest.fixture(scope="module")
def plain(path):
    return run(LTX2T2V.from_pretrained(path))


def test_model_offload_gives_the_same_video_and_audio(path, plain):
    pipeline = LTX2T2V.from_pretrained(path, deploy=StageDeployConfig(offload="model"))
    assert pipeline.accelerations == ["offload"]
    video, audio = run(pipeline)
    assert max_abs_diff(video, plain[0]) <= TOLERANCE and max_abs_diff(audio, plain[1]) <= TOLERANCE
    assert pipeline.offload_residency.current is not None  # components really moved on and off


def test_vae_tiling_decodes_in_tiles_like_diffusers(path, plain):
    import torch
    from diffusers import LTX2Pipeline

    # Tiles smaller than the 64x64 video, so the tiled path really runs (blended overlaps).
    tiles = dict(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=24,
                 tile_sample_stride_width=24)
    pipeline = LTX2T2V.from_pretrained(path, deploy=StageDeployConfig(vae_use_tiling=True))
    assert pipeline.accelerations == ["vae_tiling"] and pipeline.vae.use_tiling
    pipeline.vae.enable_tiling(**tiles)
    video, audio = run(pipeline)
    assert max_abs_diff(audio, plain[1]) <= TOLERANCE  # the soundtrack does not pass the video VAE
    assert max_abs_diff(video, plain[0]) > 1e-2  # the tiles really changed the decode
    # ... exactly as diffusers' own pipeline decodes with the same tiles.
    reference = load_reference(LTX2Pipeline, path)
    reference.vae.enable_tiling(**tiles)
    out = reference(prompt="a cat", negative_prompt="blurry", height=64, width=64, num_frames=9, frame_rate=24.0,
                    num_inference_steps=2, max_sequence_length=32, spatio_temporal_guidance_blocks=[1],
                    generator=torch.Generator("cpu").manual_seed(3), output_type="np")
    assert max_abs_diff(video, out.frames[0]) <= TOLERANCE


def test_per_request_lora_matches_diffusers_with_the_adapter(path, plain, tmp_path):
    # One batch: a request with the adapter at 0.8, one without; each as diffusers gives it.
    import torch
    from diffusers import LTX2Pipeline

    from omnistage.diffusion.params import LoraRequest
    from omnistage.testing.lora import build_lora

    lora = build_lora(path, tmp_path / "style.safetensors")
    pipeline = LTX2T2V.from_pretrained(path, deploy=StageDeployConfig(lora_adapters={"style": str(lora)}))
    styled_params = PARAMS.model_copy(update={"lora": LoraRequest(name="style", scale=0.8)})
    (styled, styled_audio), (base, base_audio) = pipeline.decode_av(pipeline.denoise(
        [DiffusionRequest("s", "a cat", styled_params), DiffusionRequest("b", "a cat", PARAMS)]))
    assert max_abs_diff(base, plain[0]) <= TOLERANCE and max_abs_diff(base_audio, plain[1]) <= TOLERANCE
    reference = load_reference(LTX2Pipeline, path)
    reference.load_lora_weights(str(lora), adapter_name="style")
    reference.set_adapters(["style"], adapter_weights=[0.8])
    out = reference(prompt="a cat", negative_prompt="blurry", height=64, width=64, num_frames=9, frame_rate=24.0,
                    num_inference_steps=2, max_sequence_length=32, spatio_temporal_guidance_blocks=[1],
                    generator=torch.Generator("cpu").manual_seed(3), output_type="np")
    assert max_abs_diff(styled, out.frames[0]) <= TOLERANCE
    assert max_abs_diff(styled_audio, out.audio[0].numpy()) <= TOLERANCE
    assert max_abs_diff(styled, base) > 1e-2  # the adapter really changes the video


@pytest.mark.parametrize("fields, message", [
    ({"executor": "mp", "num_devices": 2, "cfg_parallel_size": 2},
     r"cfg_parallel_size=2: LTX2Pipeline cannot take it: it runs its own multi-pass guidance"),
    ({"cache_backend": "first_block_cache"}, r"cache_backend='first_block_cache': LTX2Pipeline cannot take it"),
    ({"cache_backend": "tea_cache"}, r"cache_backend='tea_cache': LTX2Pipeline cannot take it"),
    ({"executor": "mp", "num_devices": 2, "ulysses_degree": 2}, r"ulysses_degree=2: LTX2Pipeline cannot take it"),
])
def test_refused_by_name_at_load(path, fields, message):
    with pytest.raises(ValueError, match=message):
        LTX2T2V.from_pretrained(path, deploy=StageDeployConfig(**fields))


def test_engine_step_mode_joins_and_returns_video_with_audio(path, plain):
    # Through DiffusionEngine in step mode: a second request joins after the first one's first
    # step; each comes back as the VideoPayload (frames and soundtrack) it gives alone.
    from omnistage.core.types import StageRequest
    from omnistage.diffusion.engine import DiffusionEngine

    engine = DiffusionEngine(str(path), config=StageDeployConfig(step_execution=True, max_num_seqs=2))
    try:
        engine.add_request(StageRequest("a", "a cat", PARAMS))
        done = {out.request_id: out for out in engine.step() if out.finished}
        engine.add_request(StageRequest("b", "a cat", PARAMS.model_copy(update={"seed": 4})))
        while engine.has_unfinished_requests():
            done.update({out.request_id: out for out in engine.step() if out.finished})
    finally:
        engine.close()
    video_a, audio_a = done["a"].payload.frames, done["a"].payload.audio
    assert done["a"].error is None and done["b"].error is None
    assert np.abs(video_a / 255 - plain[0]).max() <= 1 / 255 + 1e-6
    assert max_abs_diff(audio_a, plain[1]) <= TOLERANCE and done["a"].payload.sample_rate == 16000
    assert max_abs_diff(done["b"].payload.audio, audio_a) > 1e-3  # another seed, another soundtrack
