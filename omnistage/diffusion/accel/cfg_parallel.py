"""`cfg_parallel_size: 2`: the conditional and unconditional branches of classifier-free
guidance run on two ranks at once, then every rank combines them by the family's rule.

It replaces the one guidance function (`guided_predictions`) on the pipeline: rank 0 of the
CFG group (the "cfg" dimension of the stage mesh, parallel_groups.py) runs
the cond rows, rank 1 the uncond rows of the states guided at this step, and the ranks
swap their predictions (all_gathers of tensors: the sizes, the shapes, the values), so
both hold identical states step after step and rank 0's output is the one returned. A
family without a CFG branch (the generic adapter runs diffusers' own loop) is refused by name.
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


_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
"""The dtypes a prediction may have, by the code its header sends."""


def _exchange(mine: list[torch.Tensor], group: Any, device: torch.device) -> list[list[torch.Tensor]]:
    """Every rank's list of tensors, on every rank: three all_gathers of tensors (sizes, headers
    of dtype and shapes, values), nothing pickled."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    header = [_DTYPES.index(mine[0].dtype) if mine else 0, len(mine)]
    for t in mine:
        header += [t.dim(), *t.shape]
    flat = torch.cat([t.reshape(-1).to(mine[0].dtype) for t in mine]) if mine else torch.empty(0, device=device)
    sizes = _all_gather(torch.tensor([len(header), flat.numel()], device=device), group, world)
    sizes = torch.stack(sizes).tolist()  # the one host sync: how much each rank sends
    max_header, max_values = max(h for h, _ in sizes), max(n for _, n in sizes)
    headers = _all_gather(torch.tensor(header + [0] * (max_header - len(header)), device=device), group, world)
    headers = torch.stack(headers).tolist()
    # one dtype on the wire: the first sender's (the ranks run one model); each piece keeps its own
    dtype = next((_DTYPES[h[0]] for h, (_, n) in zip(headers, sizes) if n), torch.float32)
    values = _all_gather(torch.cat([flat.to(dtype), flat.new_zeros(max_values - flat.numel(), dtype=dtype)]),
                         group, world)
    out = []
    for header, (_, size), data in zip(headers, sizes, values):
        shapes, at = [], 2
        for _ in range(header[1]):
            shapes.append(tuple(header[at + 1:at + 1 + header[at]]))
            at += 1 + header[at]
        pieces = data[:size].split([math.prod(shape) for shape in shapes]) if shapes else []
        out.append([piece.view(shape).to(_DTYPES[header[0]]) for piece, shape in zip(pieces, shapes)])
    return out


def _all_gather(t: torch.Tensor, group: Any, world: int) -> list[torch.Tensor]:
    import torch.distributed as dist

    gathered = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(gathered, t.contiguous(), group=group)
    return gathered
