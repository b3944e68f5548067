"""Quantization of a model's Linear layers through torchao, one table of methods shared by the
diffusion stages (their transformers: diffusion/accel/quantization.py) and the AR engine.

Weight-only: `int8` stores each linear weight as int8 with one scale per output channel
and dequantizes it inside the matmul (CPU and GPU); `fp8` stores it as float8_e4m3fn with
per-channel scales (on CPU only the storage saving counts: the matmul dequantizes).
Activations stay in the model's dtype, so quality cost is only the rounding of the weights.

Dynamic (activations too): `int8_dynamic` also rounds each activation row to int8 at run
time (one scale per token) and multiplies int8 by int8. On CUDA that is torchao's int8 GEMM.
On CPU the layers become our `DynamicInt8Linear` (int8_linear.py: the same rounding, through
`torch._int_mm` with a third of torchao's eager ops around it): oneDNN's int8 GEMM, faster
than fp32 where the CPU has AVX512-VNNI or AMX, slower where it has not
(benchmarks/RESULTS.md, "Dynamic int8 DiT"). `fp8_dynamic` rounds activations and weights to
float8_e4m3fn (per row) for CUDA's fp8 GEMM: CUDA only, compute capability 8.9+.

`ignored_layers` (fnmatch patterns over the layer names inside the model, e.g. "proj_out" or
"*.adaLN_modulation.*") keeps matching layers in full precision. An unknown method, or one the
platform cannot run, is refused naming both.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

import torch

from omnistage.core.int8_linear import DynamicInt8Linear


@dataclass(frozen=True)
class Method:
    config: str
    """The torchao `quantize_` config class that implements it."""
    min_cuda_capability: tuple[int, int] = (0, 0)
    cuda_only: str | None = None
    """Why it cannot run on CPU, where it cannot."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the config class."""
    cpu_linear: bool = False
    """On CPU, plain Linear layers become our `DynamicInt8Linear` (int8_linear.py) instead."""


METHODS: dict[str, Method] = {
    "int8": Method("Int8WeightOnlyConfig"),
    "fp8": Method("Float8WeightOnlyConfig", min_cuda_capability=(8, 9)),
    # set_inductor_config=False: torchao would otherwise change Inductor's global settings.
    "int8_dynamic": Method("Int8DynamicActivationInt8WeightConfig", options={"set_inductor_config": False},
                           cpu_linear=True),
    "fp8_dynamic": Method("Float8DynamicActivationFloat8WeightConfig", min_cuda_capability=(8, 9),
                          cuda_only="its float8 x float8 matmul (torch._scaled_mm) has no CPU kernel",
                          options={"granularity": "per_row", "set_inductor_config": False}),
}


def check_method(method: str, device: torch.device) -> Method:
    """The registry entry of `method` on `device`; ValueError naming both otherwise."""
    if method not in METHODS:
        raise ValueError(f"quantization: unknown method {method!r}; known methods: {', '.join(METHODS)}")
    entry = METHODS[method]
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if capability < entry.min_cuda_capability:
            raise ValueError(f"quantization: {method!r} needs CUDA compute capability "
                             f"{'.'.join(map(str, entry.min_cuda_capability))}, device {device} has "
                             f"{'.'.join(map(str, capability))}")
    elif device.type == "cpu" and entry.cuda_only:
        raise ValueError(f"quantization: {method!r} needs a CUDA device, got {device}: {entry.cuda_only}")
    elif device.type != "cpu":
        raise ValueError(f"quantization: {method!r} is not supported on device type {device.type!r} (cpu, cuda)")
    return entry


def quantize_linears(model: torch.nn.Module, entry: Method, ignored_layers: tuple[str, ...] = ()) -> None:
    """Quantize the model's Linear layers but those `ignored_layers` names: torchao's `quantize_`,
    or for a `cpu_linear` method our `DynamicInt8Linear` in place of each plain `nn.Linear` on
    the CPU (subclasses, whose forward may differ, and layers on a GPU stay torchao's)."""
    import torchao.quantization

    def is_quantized(module: torch.nn.Module, name: str) -> bool:
        return isinstance(module, torch.nn.Linear) and not any(fnmatch.fnmatch(name, p) for p in ignored_layers)

    if entry.cpu_linear:
        swaps = [(parent, child_name) for name, parent in model.named_modules()
                 for child_name, child in parent.named_children()
                 if type(child) is torch.nn.Linear and child.weight.device.type == "cpu"
                 and is_quantized(child, f"{name}.{child_name}" if name else child_name)]
        for parent, child_name in swaps:  # one layer at a time: each fp32 weight is freed as its int8 copy lands
            setattr(parent, child_name, DynamicInt8Linear(getattr(parent, child_name)))
    torchao.quantization.quantize_(model, torchao_config(entry), filter_fn=is_quantized)


def torchao_config(entry: Method) -> Any:
    import torchao.quantization

    options = dict(entry.options)
    if options.get("granularity") == "per_row":  # a torchao object, made here so the table stays import-free
        options["granularity"] = torchao.quantization.PerRow()
    return getattr(torchao.quantization, entry.config)(**options)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor holds, through torchao's tensor subclasses (their inner data and scales)."""
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers as stored (quantized weights count as such)."""
    return sum(tensor_bytes(t) for t in [*module.parameters(), *module.buffers()])
