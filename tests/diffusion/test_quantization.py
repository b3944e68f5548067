"""`quantization`: torchao weight-only int8 / fp8 and dynamic int8 (activations too) of the
transformer's linear layers, on the zoo's Z-Image: a fraction of the fp32 bytes, close to the
plain run, activations quantized only by the dynamic method (on CPU through our int8 x int8
layer, whose product is `torch._int_mm`), `ignored_layers` kept; fp8 activations are refused
on CPU with the reason."""

from __future__ import annotations

import pytest
import torch

from torch.utils._python_dispatch import TorchDispatchMode

from omnistage.core.int8_linear import DynamicInt8Linear
from omnistage.core.quantization import check_method, weight_bytes

from accel_common import load, psnr, run


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("z-image")


@pytest.fixture(scope="module")
def plain(path):
    pipeline = load("z-image", path)
    return pipeline, run(pipeline, "z-image")


def quantizes_activations(module: torch.nn.Module) -> bool:
    """Whether its first linear layer rounds the activations too (our CPU layer, or a torchao
    weight of a dynamic method)."""
    linear = next(m for m in module.modules() if isinstance(m, (torch.nn.Linear, DynamicInt8Linear)))
    return isinstance(linear, DynamicInt8Linear) or getattr(linear.weight, "act_quant_kwargs", None) is not None


# int8_dynamic measured 46.8 dB here (int8 56 dB): the activations' rounding costs ~9 dB.
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


class Ops(TorchDispatchMode):
    """The aten ops a block of code calls, by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.name())
        return func(*args, **(kwargs or {}))


def test_int8_dynamic_multiplies_int8_by_int8_on_cpu(path):
    """Every linear layer of the transformer is our int8 layer, and a request's int8 products are
    `torch._int_mm` calls, one per layer call, with none of torchao's quantization ops."""
    ours = load("z-image", path, quantization="int8_dynamic")
    layers = [m for m in ours.transformer.modules() if isinstance(m, (torch.nn.Linear, DynamicInt8Linear))]
    assert layers and all(type(m) is DynamicInt8Linear for m in layers)
    calls = []
    hooks = [m.register_forward_hook(lambda *_: calls.append(1)) for m in layers]
    with Ops() as ops:
        run(ours, "z-image")
    for hook in hooks:
        hook.remove()
    assert calls and ops.names.count("aten::_int_mm") == len(calls)
    assert not [n for n in ops.names if n.startswith("torchao::")]


def test_int8_dynamic_runs_a_model_that_reads_its_linear_dtype(zoo):
    """Wan's time embedder takes its dtype from its first parameter, which our int8 layer has (its
    scales, in the layer's dtype); the video stays close to the plain run (measured 46.5 dB)."""
    path = zoo("wan-t2v")
    want = run(load("wan-t2v", path), "wan-t2v")
    got = run(load("wan-t2v", path, quantization="int8_dynamic"), "wan-t2v")
    assert 40.0 <= psnr(got, want) < float("inf")
