"""`quantization`: torchao weight-only int8 / fp8 and dynamic int8 (activations too) of the
transformer's linear layers, on the zoo's Z-Image: a fraction of the fp32 bytes, close to the
plain run, activations quantized only by the dynamic method, `ignored_layers` kept; fp8
activations are refused on CPU with the reason."""

from __future__ import annotations

import pytest
import torch

from omnistage.diffusion.accel.quantization import check_method, weight_bytes

from accel_common import load, psnr, run


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("z-image")


@pytest.fixture(scope="module")
def plain(path):
    pipeline = load("z-image", path)
    return pipeline, run(pipeline, "z-image")


def quantizes_activations(module: torch.nn.Module) -> bool:
    """Whether its first Linear's weight rounds the activations too (torchao's dynamic methods)."""
    linear = next(m for m in module.modules() if isinstance(m, torch.nn.Linear))
    return getattr(linear.weight, "act_quant_kwargs", None) is not None


# int8_dynamic measured 47.5 dB here (int8 56 dB): the activations' rounding costs ~9 dB.
@pytest.mark.parametrize("method, min_psnr", [("int8", 45.0), ("fp8", 32.0), ("int8_dynamic", 40.0)])
def test_weights_shrink_and_output_stays_close(path, plain, method, min_psnr):
    base, want = plain
    ours = load("z-image", path, quantization=method)
    assert ours.accelerations == ["quantization"]
    assert weight_bytes(ours.transformer) <= 0.3 * weight_bytes(base.transformer)
    assert quantizes_activations(ours.transformer) == method.endswith("_dynamic")
    assert weight_bytes(ours.text_encoder) == weight_bytes(base.text_encoder)  # only the transformer
    got = run(ours, "z-image")
    assert psnr(got, want) >= min_psnr
    assert psnr(got, want) < float("inf")  # really quantized, not a copy


def test_ignored_layers_keep_full_precision(path):
    ours = load("z-image", path, quantization="int8", ignored_layers=["layers.0.*", "final_layer.*"])
    kept = {n for n, m in ours.transformer.named_modules()
            if isinstance(m, torch.nn.Linear) and type(m.weight) is torch.nn.Parameter}
    linears = {n for n, m in ours.transformer.named_modules() if isinstance(m, torch.nn.Linear)}
    assert kept and kept == {n for n in linears if n.startswith(("layers.0.", "final_layer."))}
    assert kept != linears


def test_unknown_method_and_unsupported_device_are_named(path):
    with pytest.raises(ValueError, match=r"unknown method 'int3'; known methods: int8, fp8, int8_dynamic, fp8_dynamic"):
        load("z-image", path, quantization="int3")
    with pytest.raises(ValueError, match=r"'fp8_dynamic' needs a CUDA device, got cpu: .* has no CPU kernel"):
        check_method("fp8_dynamic", torch.device("cpu"))
    with pytest.raises(ValueError, match=r"'fp8' is not supported on device type 'mps'"):
        check_method("fp8", torch.device("mps"))
