"""`offload`: keep weights in CPU memory and bring them to the execution device only
while they run, so a model larger than the device fits (at the cost of the copies).

- `model`: each component (text encoders, transformer, VAE) moves to the device when it
  starts to run and back when another one needs the device: one component at a time is
  resident. The hook is an accelerate `ModelHook`, the kind diffusers' VAEs honour in
  `encode`/`decode` (`apply_forward_hook`), not only in `forward`.
- `layerwise`: the transformers' blocks are copied to the device `offload_blocks_per_group`
  at a time through diffusers' group offloading, the next group prefetched on a side CUDA
  stream while the current one computes; the other components are offloaded as in `model`.

Outputs are identical to no offload: the same weights run the same kernels on the same
device; only where they wait in between changes. The pipeline is loaded on the CPU
(`DiffusionPipelineBase.from_pretrained` skips its `.to(device)` when offload is on), so
the device never holds everything at once, not even at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig

OFFLOAD_DEVICE = torch.device("cpu")


@dataclass(frozen=True)
class OffloadConfig:
    mode: str
    """"model" | "layerwise"."""
    blocks_per_group: int = 1
    """layerwise: transformer blocks copied to the device together."""


def from_deploy(deploy: StageDeployConfig) -> OffloadConfig | None:
    return None if deploy.offload is None else OffloadConfig(deploy.offload, deploy.offload_blocks_per_group)


class Residency:
    """Which offloaded component holds the execution device now; bringing one sends the other back."""

    def __init__(self, device: torch.device):
        self.device = device
        self.current: torch.nn.Module | None = None

    def bring(self, module: torch.nn.Module) -> None:
        if self.current is module:
            return
        if self.current is not None:
            self.current.to(OFFLOAD_DEVICE)
        module.to(self.device)
        self.current = module

    def clear(self) -> None:
        """Send the resident component back (a layerwise transformer is about to run)."""
        if self.current is not None:
            self.current.to(OFFLOAD_DEVICE)
            self.current = None


def _model_offload_hook(residency: Residency) -> Any:
    from accelerate.hooks import ModelHook
    from accelerate.utils import send_to_device

    class OnDeviceWhileRunning(ModelHook):
        """Brings its module to the device before it runs (forward, or a VAE's encode/decode)."""

        def pre_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            residency.bring(module)
            return send_to_device(args, residency.device), send_to_device(kwargs, residency.device)

    return OnDeviceWhileRunning()


def apply(pipeline: Any, config: OffloadConfig) -> None:
    from accelerate.hooks import add_hook_to_module

    from omnistage.diffusion.generic import GenericDiffusersPipeline

    if isinstance(pipeline, GenericDiffusersPipeline):
        raise ValueError(f"offload: {pipeline.reference_class} runs through the generic diffusers adapter, "
                         "which does not support offload (diffusers' own loop places its inputs itself)")
    if config.mode not in ("model", "layerwise"):
        raise ValueError(f"offload: unknown mode {config.mode!r}; known modes: model, layerwise")
    if config.blocks_per_group < 1:
        raise ValueError(f"offload_blocks_per_group must be >= 1, got {config.blocks_per_group}")
    modules = {name: c for name, c in pipeline.components.items() if isinstance(c, torch.nn.Module)}
    layerwise = {name for name in modules if config.mode == "layerwise" and name.startswith("transformer")}
    if config.mode == "layerwise" and not layerwise:
        raise ValueError(f"offload: layerwise: {pipeline.reference_class} has no transformer component")
    residency = Residency(pipeline.device)
    for name, module in modules.items():
        module.to(OFFLOAD_DEVICE)
        if name in layerwise:
            _apply_group_offloading(module, pipeline.device, config.blocks_per_group)
            module.register_forward_pre_hook(lambda _module, _args: residency.clear())
        else:
            add_hook_to_module(module, _model_offload_hook(residency))
    pipeline.offload_residency = residency


def _apply_group_offloading(module: torch.nn.Module, device: torch.device, blocks_per_group: int) -> None:
    from diffusers.hooks import apply_group_offloading

    use_stream = device.type == "cuda"
    apply_group_offloading(module, onload_device=device, offload_device=OFFLOAD_DEVICE, offload_type="block_level",
                           num_blocks_per_group=blocks_per_group, use_stream=use_stream, non_blocking=use_stream)
