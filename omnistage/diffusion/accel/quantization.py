"""`quantization`: quantization of the transformer's linear layers (torchao).

Weight-only: `int8` stores each linear weight as int8 with one scale per output channel
and dequantizes it inside the matmul (CPU and GPU); `fp8` stores it as float8_e4m3fn with
per-channel scales (on CPU only the storage saving counts: the matmul dequantizes).
Activations stay in the model's dtype, so quality cost is only the rounding of the weights.

Dynamic (activations too): `int8_dynamic` also rounds each activation row to int8 at run
time (one scale per token) and multiplies int8 by int8. On CUDA that is one int8 GEMM. On
CPU torchao writes it as an int32 matmul that Inductor is meant to fuse into oneDNN's int8
kernels (AVX512-VNNI / AMX); run eagerly, or on a CPU without them, it is much slower than
fp32 (benchmarks/RESULTS.md, "Dynamic int8 DiT"). `fp8_dynamic` rounds activations and
weights to float8_e4m3fn (per row) for CUDA's fp8 GEMM: CUDA only, compute capability 8.9+.

`ignored_layers` (fnmatch patterns over the layer names inside the transformer,
e.g. "proj_out" or "*.adaLN_modulation.*") keeps matching layers in full precision.
Everything but the transformer (text encoders, VAE) is left as loaded.

An unknown method, or one the platform cannot run, is refused naming both.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig


@dataclass(frozen=True)
class Method:
    config: str
    """The torchao `quantize_` config class that implements it."""
    min_cuda_capability: tuple[int, int] = (0, 0)
    cuda_only: str | None = None
    """Why it cannot run on CPU, where it cannot."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the config class."""


METHODS: dict[str, Method] = {
    "int8": Method("Int8WeightOnlyConfig"),
    "fp8": Method("Float8WeightOnlyConfig", min_cuda_capability=(8, 9)),
    # set_inductor_config=False: torchao would otherwise change Inductor's global settings.
    "int8_dynamic": Method("Int8DynamicActivationInt8WeightConfig", options={"set_inductor_config": False}),
    "fp8_dynamic": Method("Float8DynamicActivationFloat8WeightConfig", min_cuda_capability=(8, 9),
                          cuda_only="its float8 x float8 matmul (torch._scaled_mm) has no CPU kernel",
                          options={"granularity": "per_row", "set_inductor_config": False}),
}


@dataclass(frozen=True)
class QuantizationConfig:
    method: str
    ignored_layers: tuple[str, ...] = ()


def from_deploy(deploy: StageDeployConfig) -> QuantizationConfig | None:
    if deploy.quantization is None:
        return None
    return QuantizationConfig(deploy.quantization, deploy.ignored_layers)


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


def quantized_components(pipeline: Any) -> dict[str, torch.nn.Module]:
    """The denoising transformers of the pipeline (Wan 2.2 has two)."""
    return {name: c for name, c in pipeline.components.items()
            if name.startswith("transformer") and isinstance(c, torch.nn.Module)}


def apply(pipeline: Any, config: QuantizationConfig) -> None:
    entry = check_method(config.method, pipeline.device)
    models = quantized_components(pipeline)
    if not models:
        raise ValueError(f"quantization: {pipeline.reference_class} has no transformer component to quantize")

    for model in models.values():
        quantize_linears(model, entry, config.ignored_layers)


def quantize_linears(model: torch.nn.Module, entry: Method, ignored_layers: tuple[str, ...] = ()) -> None:
    """torchao's `quantize_` over the model's Linear layers but those `ignored_layers` names.
    The AR engine quantizes its LLMs through this too (ar/engine.py)."""
    import torchao.quantization

    def is_quantized(module: torch.nn.Module, name: str) -> bool:
        return isinstance(module, torch.nn.Linear) and not any(fnmatch.fnmatch(name, p) for p in ignored_layers)

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
