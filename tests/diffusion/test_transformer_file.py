"""`transformer_file`: a GGUF transformer (Q8_0, written by the zoo's gguf builder) in place of
the zoo Z-Image's own, against diffusers' ZImagePipeline given the same file through its own
GGUF loader, same seed; SVDQuant files, other formats and quantization on top are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from omnistage.diffusion import transformer_file
from omnistage.testing.gguf_files import build_transformer_gguf

from accel_common import call_kwargs, load, run
from parity import load_reference, reference_arrays


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("z-image")


@pytest.fixture(scope="module")
def gguf_file(path, tmp_path_factory):
    return str(build_transformer_gguf(path, tmp_path_factory.mktemp("gguf") / "z-image-Q8_0.gguf"))


def test_gguf_transformer_matches_diffusers_gguf_pipeline(path, gguf_file):
    from diffusers import GGUFQuantizationConfig, ZImagePipeline, ZImageTransformer2DModel
    from diffusers.quantizers.gguf.utils import GGUFParameter

    ours = load("z-image", path, transformer_file=gguf_file)
    linear = ours.transformer.layers[0].attention.to_q
    assert isinstance(linear.weight, GGUFParameter) and linear.weight.dtype == torch.uint8  # Q8_0 blocks, in memory
    transformer = ZImageTransformer2DModel.from_single_file(
        gguf_file, config=str(path), subfolder="transformer", torch_dtype=torch.float32,
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32))
    want = reference_arrays(load_reference(ZImagePipeline, path, transformer=transformer), call_kwargs("z-image"), 3)
    got = run(ours, "z-image")
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert not np.array_equal(got, run(load("z-image", path), "z-image"))  # the GGUF weights, not the folder's


def test_svdquant_other_formats_and_quantization_on_top_are_refused(path, gguf_file, tmp_path):
    svdq = tmp_path / "svdq-int4_r32-z-image.safetensors"
    save_file({"layers.0.attention.qkv.qweight": torch.zeros(4, 2, dtype=torch.int8),
               "layers.0.attention.qkv.wscales": torch.zeros(1, 4)}, str(svdq))
    with pytest.raises(ValueError, match=r"transformer_file: svdq-int4_r32-z-image.safetensors is an SVDQuant "
                                         r"\(Nunchaku\) checkpoint: .*CUDA kernels"):
        load("z-image", path, transformer_file=str(svdq))
    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(1)}, str(plain))
    with pytest.raises(ValueError, match=r"plain.safetensors is not a .gguf file"):
        load("z-image", path, transformer_file=str(plain))
    with pytest.raises(ValueError, match=r"a GGUF file is quantized already; remove quantization='int8'"):
        load("z-image", path, transformer_file=gguf_file, quantization="int8")
    assert transformer_file.SVDQUANT_REASON in str(pytest.raises(ValueError, load, "z-image", path,
                                                                  transformer_file=str(svdq)).value)
