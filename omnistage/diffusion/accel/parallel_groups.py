"""The stage's process groups for its parallel degrees, built in one place.

The ranks of a stage form one mesh of shape (cfg_parallel_size, ring_degree, ulysses_degree,
tensor_parallel_size, fsdp_degree) (`cfg x ring x ulysses x tensor x fsdp = num_devices`, checked by
StageDeployConfig): CFG parallel takes the "cfg" dimension (ranks that hold the same piece of
the token sequence and run different branches), sequence parallel the ("ring", "ulysses")
dimensions (ranks that run the same branch over different pieces of the sequence), tensor
parallel the innermost "tensor" dimension (ranks that hold different shards of the same
weights, so their all-reduces stay between neighbouring devices), and FSDP the "fsdp" dimension
(ranks that run the same work and each keep a shard of every weight, gathered block by block:
innermost too, since it is not combined with tensor parallel). Building the mesh is collective, so every
rank builds it here, once per process and world, in the same order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

MESH_DIMS = ("cfg", "ring", "ulysses", "tensor", "fsdp")


@dataclass(frozen=True)
class Degrees:
    cfg: int = 1
    ring: int = 1
    ulysses: int = 1
    tensor: int = 1
    fsdp: int = 1

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (self.cfg, self.ring, self.ulysses, self.tensor, self.fsdp)

    @property
    def num_devices(self) -> int:
        return math.prod(self.shape)

    def describe(self) -> str:
        """The degrees that are set, as deploy fields (for error messages)."""
        fields = {"cfg_parallel_size": self.cfg, "ring_degree": self.ring, "ulysses_degree": self.ulysses,
                  "tensor_parallel_size": self.tensor, "fsdp_degree": self.fsdp}
        return " x ".join(f"{name}={value}" for name, value in fields.items() if value > 1) or "no parallel degree"


@dataclass(frozen=True)
class ParallelGroups:
    degrees: Degrees
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh with dims MESH_DIMS

    @property
    def cfg_group(self) -> Any:
        return self.mesh["cfg"].get_group()

    @property
    def tensor_group(self) -> Any:
        """The ranks that hold the shards of one copy of the weights (tensor_parallel.py)."""
        return self.mesh["tensor"].get_group()

    @property
    def fsdp_mesh(self) -> Any:
        """The 1-D mesh of the ranks that share one copy of the weights as shards (fsdp.py)."""
        return self.mesh["fsdp"]

    @property
    def sequence_mesh(self) -> Any:
        """The ("ring", "ulysses") mesh of the ranks that split one branch's token sequence."""
        return self.mesh["ring", "ulysses"]


_built: dict[tuple, ParallelGroups] = {}


def parallel_groups(degrees: Degrees, device: torch.device) -> ParallelGroups:
    """This process's groups for `degrees`; ValueError when the world does not match them."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized() or dist.get_world_size() != degrees.num_devices:
        raise ValueError(f"{degrees.describe()} needs executor 'mp' with num_devices={degrees.num_devices}")
    key = (id(dist.group.WORLD), degrees, device.type)
    if key not in _built:
        mesh = init_device_mesh(device.type, degrees.shape, mesh_dim_names=MESH_DIMS)
        _built[key] = ParallelGroups(degrees, mesh)
    return _built[key]


def degrees_of(deploy: Any) -> Degrees:
    return Degrees(cfg=deploy.cfg_parallel_size, ring=deploy.ring_degree, ulysses=deploy.ulysses_degree,
                   tensor=deploy.tensor_parallel_size, fsdp=deploy.fsdp_degree)
