"""`quantization`: quantization of the transformer's linear layers (torchao; the methods and what
each costs: core/quantization.py). Only the denoising transformers are quantized (Wan 2.2 has
two); everything else (text encoders, VAE) is left as loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from omnistage.core.quantization import check_method, quantize_linears

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig


@dataclass(frozen=True)
class QuantizationConfig:
    method: str
    ignored_layers: tuple[str, ...] = ()


def from_deploy(deploy: StageDeployConfig) -> QuantizationConfig | None:
    if deploy.quantization is None:
        return None
    return QuantizationConfig(deploy.quantization, deploy.ignored_layers)


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
