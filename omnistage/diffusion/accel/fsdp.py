"""`fsdp_degree: N`: the transformer's weights sharded over N ranks with torch's FSDP2
(`torch.distributed.fsdp.fully_shard`), so a transformer that does not fit one device runs.

Each rank keeps a 1/N shard of every parameter at rest (dim 0, as FSDP2 cuts it). Every
block of the classes diffusers lists in the model's `_repeated_blocks` is one FSDP unit, so
while the transformer runs only one block is whole at a time: FSDP2 all-gathers its shards
just before the block's forward and frees the gathered copy right after it. The rest of the
transformer (embeddings, final layers) is one more unit, gathered for the forward and freed
after it too (`reshard_after_forward=True` given explicitly: FSDP2 would otherwise keep the
root's parameters gathered for a backward that inference never runs). The transformer is
loaded whole into host memory and left there (`DiffusionPipelineBase.from_pretrained` moves
only the other components to the device): `fully_shard` moves each unit to the mesh's device
as it shards it, so the device never holds the whole transformer.

The ranks of the "fsdp" dimension of the stage mesh (parallel_groups.py) all run the same
requests and make the same output (rank 0's is returned): the gain is memory, not speed.
With `cfg_parallel_size: 2` each CFG branch runs on its own group of N shard holders (the
weights replicated across the branches and sharded within one: HSDP's layout). A family takes
it by declaring `fsdp` (declaration.py); the fields that wrap, move or read the weights it
shards, and the other ways of splitting the transformer, are refused with it by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from omnistage.diffusion.accel.declaration import requested
from omnistage.diffusion.accel.parallel_groups import Degrees, degrees_of, parallel_groups
from omnistage.diffusion.accel.sequence_parallel import transformers_of

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig

REFUSED_WITH = ("ulysses_degree", "ring_degree", "tensor_parallel_size", "quantization", "lora", "lora_adapters",
                "max_loras", "compile", "offload")
"""Deploy fields not combined with it yet: the other splits of the transformer and everything
that wraps, moves or quantizes the weights FSDP2 shards; none is tested with it, nor is
`cache_backend: cache_dit`. (Our step caches are: every rank computes the same values, so all
make the same decisions, and a block they skip is still called, gathered and answered from
the cache, on every rank alike.)"""


@dataclass(frozen=True)
class FsdpConfig:
    degrees: Degrees
    """All the stage's degrees: the shard group is the "fsdp" dimension of their mesh."""

    @property
    def size(self) -> int:
        return self.degrees.fsdp


def from_deploy(deploy: StageDeployConfig) -> FsdpConfig | None:
    if deploy.fsdp_degree == 1:
        return None
    clashing = [name for name, _ in requested(deploy) if name in REFUSED_WITH]
    if deploy.cache_backend == "cache_dit":  # cache-dit's own hooks over the blocks: not tested with it
        clashing.append("cache_backend=cache_dit")
    if deploy.transformer_file is not None:  # GGUF weights are quantized tensors FSDP2 cannot shard
        clashing.append("transformer_file")
    if clashing:
        raise ValueError(f"fsdp_degree={deploy.fsdp_degree} cannot be combined with {', '.join(clashing)} "
                         f"in this version of omnistage")
    return FsdpConfig(degrees_of(deploy))


def apply(pipeline: Any, config: FsdpConfig) -> None:
    from torch.distributed.fsdp import fully_shard

    field = f"fsdp_degree={config.size}"
    models = transformers_of(pipeline)
    if not pipeline.supported_accelerations.fsdp or not models:  # check_declared refuses it first
        raise ValueError(f"{field}: {pipeline.reference_class} does not declare fsdp")
    units = [blocks(model) for model in models]
    if not all(units):
        raise ValueError(f"{field}: {pipeline.reference_class}'s transformer lists no repeated blocks "
                         "(diffusers' `_repeated_blocks`) to shard one at a time")
    mesh = parallel_groups(config.degrees, pipeline.device).fsdp_mesh
    for model, model_blocks in zip(models, units):
        for block in model_blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The FSDP units of `model`: its blocks of the classes in diffusers' `_repeated_blocks` (by the
    class or a base: fully_shard gives a sharded block a subclass, FSDP<its class>)."""
    names = set(getattr(model, "_repeated_blocks", None) or ())
    return [m for m in model.modules() if any(cls.__name__ in names for cls in type(m).__mro__)]


def local_parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of `model`'s parameters this rank holds: its shards where FSDP2 sharded them."""
    return sum(_local(p).numel() * p.element_size() for p in model.parameters())


def _local(param: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return param.to_local() if isinstance(param, DTensor) else param
