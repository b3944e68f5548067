"""`cfg_parallel_size: 2`: the conditional and unconditional branches of classifier-free
guidance run on two ranks at once, then every rank combines them by the family's rule.

It replaces the one guidance function (`guided_predictions`) on the pipeline: rank 0 of the
CFG group (the "cfg" dimension of the stage mesh, parallel_groups.py) runs
the cond rows, rank 1 the uncond rows of the states guided at this step, and the ranks
swap their predictions (the shapes as a small object, the values as one flat broadcast per
rank), so both hold identical states step after step and rank 0's output is the one
returned. A family without a CFG branch (the generic adapter runs diffusers' own loop) is
refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from omnistage.diffusion.accel.parallel_groups import Degrees, degrees_of, parallel_groups
from omnistage.diffusion.guidance import Guidance, Predict

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.pipeline import DenoiseState


@dataclass(frozen=True)
class CfgParallelConfig:
    size: int = 2
    """Ranks sharing one CFG step: one per branch."""
    degrees: Degrees = Degrees(cfg=2)
    """All the stage's degrees: the CFG group is one dimension of their mesh (parallel_groups.py)."""


def from_deploy(deploy: StageDeployConfig) -> CfgParallelConfig | None:
    if deploy.cfg_parallel_size == 1:
        return None
    return CfgParallelConfig(deploy.cfg_parallel_size, degrees_of(deploy))


def apply(pipeline: Any, config: CfgParallelConfig) -> None:
    if config.size != 2:
        raise ValueError(f"cfg_parallel_size must be 1 or 2 (one rank per CFG branch), got {config.size}")
    if getattr(pipeline, "guidance", None) is None:
        raise ValueError(f"cfg_parallel_size: {pipeline.reference_class} declares no CFG branches to split "
                         "(the generic adapter runs diffusers' own loop; LTX-2 its own multi-pass guidance)")
    groups = parallel_groups(config.degrees, pipeline.device)
    pipeline.guidance_runner = partial(cfg_parallel_predictions, group=groups.cfg_group, device=pipeline.device)


def cfg_parallel_predictions(states: list[DenoiseState], predict: Predict, guidance: Guidance, *,
                             group: Any, device: torch.device) -> list[torch.Tensor]:
    import torch.distributed as dist

    scales = [guidance.scale(s) for s in states]
    guided = [s for s, scale in zip(states, scales) if scale is not None]
    if dist.get_rank(group) == 0:
        rows = [(s, "cond") for s in states]
    else:
        rows = [(s, "uncond") for s in guided]
    cond, uncond = _exchange(predict(rows) if rows else [], group, device)
    uncond_of = dict(zip(map(id, guided), uncond))
    return [c if scale is None else guidance.combine(s, c, uncond_of[id(s)], scale)
            for s, c, scale in zip(states, cond, scales)]


def _exchange(mine: list[torch.Tensor], group: Any, device: torch.device) -> list[list[torch.Tensor]]:
    """Every rank's list of tensors, on every rank."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    metas: list[Any] = [None] * world
    dist.all_gather_object(metas, [(tuple(t.shape), t.dtype) for t in mine], group=group)
    out = []
    for src, meta in enumerate(metas):
        if not meta:
            out.append([])
            continue
        sizes = [math.prod(shape) for shape, _ in meta]
        dtype = meta[0][1]
        if src == rank:
            flat = torch.cat([t.reshape(-1).to(dtype) for t in mine]).contiguous()
        else:
            flat = torch.empty(sum(sizes), dtype=dtype, device=device)
        dist.broadcast(flat, src=dist.get_global_rank(group, src), group=group)
        out.append([piece.view(shape).to(d) for piece, (shape, d) in zip(flat.split(sizes), meta)])
    return out
