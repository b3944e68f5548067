"""`vae_use_tiling`: decode (and, for edit and I2V, encode) through the diffusers VAE's own
tiling. The tiny zoo VAEs' default tiles are larger than a test image, so the tests shrink
the tiles (as diffusers' own `test_vae_tiling` does), check that several tiles really ran, and
hold tiled against untiled to the tolerance diffusers' tiling tests use (see MAX_TOLERANCE)."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.registry import pipeline_class
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image

from parity import request_for

FAMILIES = {  # zoo name -> diffusers class name; the VAE each uses
    "z-image": "ZImagePipeline",  # AutoencoderKL
    "flux": "FluxPipeline",  # AutoencoderKL
    "sd3": "StableDiffusion3Pipeline",  # AutoencoderKL
    "qwen-image": "QwenImagePipeline",  # AutoencoderKLQwenImage
    "wan-t2v": "WanPipeline",  # AutoencoderKLWan
}
WITH_IMAGE = {"qwen-image-edit": "QwenImageEditPipeline", "wan-i2v": "WanImageToVideoPipeline"}
# diffusers' pipeline tests bound tiled against untiled by 0.2 by default and by up to 0.7 for
# families whose dummy VAE seams more (e.g. 0.5, 0.6, 0.7 in its CogVideoX / Hunyuan tests).
# The zoo's random-weight VAEs are deep enough to seam like the latter: measured max 0.10
# (Qwen-Image) to 0.64 (SD3), so the bound is 0.7, with the seams confined (mean <= 0.06).
MAX_TOLERANCE, MEAN_TOLERANCE = 0.7, 0.06
SIDE, TILE, STRIDE = 128, 96, 64  # pixels: diffusers' test_vae_tiling sizes (2 x 2 tiles)


def small_tiles(vae) -> None:
    """Tiles of TILE pixels, STRIDE apart (diffusers' tests shrink them the same way)."""
    if hasattr(vae, "tile_sample_min_size"):  # AutoencoderKL: one size, a fixed overlap factor
        vae.tile_sample_min_size = TILE
        vae.tile_latent_min_size = TILE // 2 ** (len(vae.config.block_out_channels) - 1)
        vae.tile_overlap_factor = 1 - STRIDE / TILE
    else:
        vae.enable_tiling(tile_sample_min_height=TILE, tile_sample_min_width=TILE,
                          tile_sample_stride_height=STRIDE, tile_sample_stride_width=STRIDE)


def assert_within_tiling_tolerance(tiled: np.ndarray, whole: np.ndarray) -> None:
    diff = np.abs(tiled - whole)
    assert diff.max() <= MAX_TOLERANCE and diff.mean() <= MEAN_TOLERANCE


def counting(module) -> list:
    calls: list = []
    module.register_forward_pre_hook(lambda m, args: calls.append(1))
    return calls


def tiled_pipeline(name: str, cls: str, path: str):
    pipeline = pipeline_class(cls).from_pretrained(path, deploy=StageDeployConfig(vae_use_tiling=True))
    assert pipeline.accelerations == ["vae_tiling"] and pipeline.vae.use_tiling
    small_tiles(pipeline.vae)
    return pipeline


def request(name: str):
    call = {**zoo_call_kwargs(name), "num_inference_steps": 2, "height": SIDE, "width": SIDE}
    if name == "qwen-image-edit":  # diffusers' edit pipeline ignores max_sequence_length; ours refuses it
        call.pop("max_sequence_length")
    if name in WITH_IMAGE:
        call["image"] = default_input_image(SIDE)
    return request_for(call, seed=3)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_tiled_decode_within_diffusers_tolerance(zoo, name):
    pipeline = tiled_pipeline(name, FAMILIES[name], str(zoo(name)))
    states = pipeline.denoise([request(name)])
    decoder_calls = counting(pipeline.vae.decoder)
    (tiled,) = pipeline.decode_arrays(states)
    untiled_calls = 1 if name != "wan-t2v" else states[0].latents.shape[2]  # Wan decodes a frame per call
    assert len(decoder_calls) >= 4 * untiled_calls  # 2 x 2 tiles at least
    pipeline.vae.disable_tiling()
    (whole,) = pipeline.decode_arrays(states)
    assert tiled.shape == whole.shape
    assert_within_tiling_tolerance(tiled, whole)


@pytest.mark.parametrize("name", list(WITH_IMAGE))
def test_tiled_encode_of_the_input_image(zoo, name):
    pipeline = tiled_pipeline(name, WITH_IMAGE[name], str(zoo(name)))
    encoder_calls = counting(pipeline.vae.encoder)
    (tiled,) = pipeline.decode_arrays(pipeline.denoise([request(name)]))
    assert len(encoder_calls) >= 4  # the input image went through the encoder in tiles
    pipeline.vae.disable_tiling()
    (whole,) = pipeline.decode_arrays(pipeline.denoise([request(name)]))
    assert_within_tiling_tolerance(tiled, whole)
