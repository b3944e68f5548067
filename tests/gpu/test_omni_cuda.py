"""`Omni` end to end on CUDA with the bundled deploy files, so `dtype: auto` resolves to
bf16 and `devices` to cuda:0: Z-Image draws images of the asked size, qwen2-llm writes the
asked number of tokens."""

from __future__ import annotations

import pytest
import numpy as np
import torch

from omnistage import DiffusionParams, Omni, SamplingParams
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.device import resolve_device, resolve_dtype

pytestmark = pytest.mark.gpu


def test_auto_resolves_to_bf16_on_cuda():
    config = StageDeployConfig()  # devices: [], dtype: auto
    device = resolve_device(config.devices)
    assert device.type == "cuda"
    assert resolve_dtype(config.dtype, device) == torch.bfloat16


def test_z_image_bf16(zoo):
    params = DiffusionParams(num_inference_steps=2, height=32, width=64, seed=3)
    with Omni(zoo("z-image")) as omni:
        outs = omni.generate(["a cat", "a dog"], params, use_tqdm=False)
    for out in outs:
        assert out.error is None, out.error
        (image,) = out.images
        assert image.size == (64, 32)
        pixels = np.asarray(image)
        assert pixels.shape == (32, 64, 3) and pixels.std() > 0  # not a flat (NaN-clipped) picture


def test_qwen2_llm_bf16(zoo):
    params = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0)
    with Omni(zoo("qwen2-llm")) as omni:
        outs = omni.generate(["Hello world!", "Once upon a time"], params, use_tqdm=False)
    for out in outs:
        assert out.error is None, out.error
        assert len(out.token_ids) == 8 and isinstance(out.text, str)
        assert out.finish_reason == "length"
