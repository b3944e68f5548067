"""`tensor_parallel_size: N`: each rank holds 1/N of the weights of the transformer's blocks
(Megatron-style). The QKV and first MLP projections are split by output features (whole
heads, whole hidden units: no communication), the attention output and second MLP
projections by the matching input features, and their partial outputs are summed over the
"tensor" dimension of the stage mesh (parallel_groups.py) with one all-reduce each. Every rank
then holds the same activations between blocks, and rank 0's output is the one returned.

A fused projection (FLUX.2's QKV + MLP input, its SwiGLU's gate and value halves) is cut part
by part, so each rank's slice holds the same share of every part. An RMSNorm over the whole
QKV output, across heads (Wan), keeps its slice of the weight and all-reduces the sum of
squares (one small all-reduce of one number per token), so a shard normalises exactly as
the whole would. A block's own adaLN modulation (Qwen-Image's, FLUX.1's, SD3's), a Linear
from the timestep embedding to six times the width, is split by output features and its
output all-gathered: a few numbers per sample, against a third of the block's weights.

A family takes it by declaring a `TensorPlan` (declaration.py): its blocks and which of their
Linear layers are column and which row. The layers are replaced in the family's own
transformer object at load time; the full weights are read first, then sliced. It composes
with `cfg_parallel_size` (a CFG branch per group of shards); Ulysses and ring, quantization,
LoRA, compile and offload are refused with it by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from omnistage.diffusion.accel.declaration import requested
from omnistage.diffusion.accel.parallel_groups import Degrees, degrees_of, parallel_groups
from omnistage.diffusion.accel.sequence_parallel import transformers_of

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.accel.declaration import TensorPlan

REFUSED_WITH = ("ulysses_degree", "ring_degree", "quantization", "lora", "lora_adapters", "compile", "offload")
"""Deploy fields not combined with it yet: each wraps, moves or reads the Linear layers or the
heads it splits (a LoRA delta has the full layer's shape), and none is tested with it."""


@dataclass(frozen=True)
class TensorParallelConfig:
    degrees: Degrees
    """All the stage's degrees: the tensor group is the "tensor" dimension of their mesh."""

    @property
    def size(self) -> int:
        return self.degrees.tensor


def from_deploy(deploy: StageDeployConfig) -> TensorParallelConfig | None:
    if deploy.tensor_parallel_size == 1:
        return None
    clashing = [name for name, _ in requested(deploy) if name in REFUSED_WITH]
    if clashing:
        raise ValueError(f"tensor_parallel_size={deploy.tensor_parallel_size} cannot be combined with "
                         f"{', '.join(clashing)} in this version of omnistage")
    return TensorParallelConfig(degrees_of(deploy))


def apply(pipeline: Any, config: TensorParallelConfig) -> None:
    import torch.distributed as dist

    plans = pipeline.supported_accelerations.tensor_parallel
    models = transformers_of(pipeline)
    if not plans or not models:  # check_declared refuses it first; this guards direct calls
        raise ValueError(f"tensor_parallel_size: {pipeline.reference_class} declares no tensor-parallel plan")
    for model in models:
        for plan in plans:
            _check_divides(model, plan, config.size, pipeline.reference_class)
    group = parallel_groups(config.degrees, pipeline.device).tensor_group
    rank = dist.get_rank(group)
    for model in models:
        for plan in plans:
            for block in plan.blocks(model):
                shard_block(block, plan, rank, config.size, group)


def _check_divides(model: Any, plan: TensorPlan, size: int, family: str) -> None:
    blocks = plan.blocks(model)
    for name in plan.attention if blocks else ():
        if (heads := blocks[0].get_submodule(name).heads) % size:
            raise ValueError(f"tensor_parallel_size={size} does not divide the {heads} attention heads of "
                             f"{family}")
    # A processor that splits a fused output by its parts' global ratio (FLUX.2's) needs equal cuts,
    # and an all-gather equal pieces.
    for name in plan.column if blocks else ():
        for width in plan.column_parts(blocks[0], name) or ():
            if width % size:
                raise ValueError(f"tensor_parallel_size={size} does not divide the {width} features of a part of "
                                 f"{name} of {family}")
    for name in plan.gathered if blocks else ():
        if (width := blocks[0].get_submodule(name).out_features) % size:
            raise ValueError(f"tensor_parallel_size={size} does not divide the {width} features of {name} of "
                             f"{family}")


def shard_slice(features: int, rank: int, size: int) -> slice:
    """This rank's features of `features`, as torch.tensor_split cuts them: the first
    `features % size` ranks take one more (an MLP width need not divide; heads do, checked)."""
    base, extra = divmod(features, size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def shard_index(parts: list[int], rank: int, size: int, device: torch.device | None = None) -> torch.Tensor:
    """This rank's feature indices of features that concatenate `parts` (their full widths),
    each part cut as shard_slice cuts it."""
    starts = [sum(parts[:i]) for i in range(len(parts))]
    cut = [shard_slice(width, rank, size) for width in parts]
    return torch.cat([torch.arange(start + s.start, start + s.stop, device=device) for start, s in zip(starts, cut)])


def shard_block(block: torch.nn.Module, plan: TensorPlan, rank: int, size: int, group: Any) -> None:
    """Replace the plan's layers of `block` by this rank's shards (`rank` of `size`)."""
    for name in plan.column:
        linear = block.get_submodule(name)
        parts = plan.column_parts(block, name) or [linear.out_features]
        block.set_submodule(name, column_shard(linear, rank, size, parts))
    for name in plan.row:
        linear = block.get_submodule(name)
        parts = plan.row_parts(block, name) or [linear.in_features]
        block.set_submodule(name, RowParallelLinear(linear, rank, size, group, parts))
    for name in plan.norms:
        block.set_submodule(name, ShardedRMSNorm(block.get_submodule(name), rank, size, group))
    for name in plan.gathered:
        block.set_submodule(name, GatheredLinear(block.get_submodule(name), rank, size, group))
    if plan.local_heads:
        for name in plan.attention:
            block.get_submodule(name).heads //= size


def column_shard(linear: torch.nn.Linear, rank: int, size: int, parts: list[int] | None = None) -> torch.nn.Linear:
    """A plain Linear of this rank's slice of output features (of each of `parts`, their full
    widths, when the layer fuses several): its output stays sharded."""
    rows = shard_index(parts or [linear.out_features], rank, size, linear.weight.device)
    shard = torch.nn.Linear(linear.in_features, len(rows), bias=linear.bias is not None,
                            device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        shard.weight.copy_(linear.weight.index_select(0, rows))
        if linear.bias is not None:
            shard.bias.copy_(linear.bias.index_select(0, rows))
    return shard.requires_grad_(linear.weight.requires_grad)


class RowParallelLinear(torch.nn.Module):
    """A Linear layer's slice of input features: the ranks' partial products are summed
    (all-reduce over `group`), then the bias is added once. An input that concatenates several
    sharded outputs (`parts`, their full widths) keeps this rank's slice of each."""

    def __init__(self, linear: torch.nn.Linear, rank: int, size: int, group: Any, parts: list[int]) -> None:
        super().__init__()
        index = shard_index(parts, rank, size, linear.weight.device)
        self.in_features, self.out_features = len(index), linear.out_features
        self.weight = torch.nn.Parameter(linear.weight.detach().index_select(1, index).contiguous(),
                                         requires_grad=linear.weight.requires_grad)
        self.bias = linear.bias
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        out = F.linear(x, self.weight)
        dist.all_reduce(out, group=self.group)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (a shard), out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class ShardedRMSNorm(torch.nn.Module):
    """torch.nn.RMSNorm over features that are sharded over `group` (a column layer's output,
    across heads): this rank's slice of the weight; the sum of squares is all-reduced, so the
    mean runs over all the features, as on one rank. Computed in float32 like torch's own."""

    def __init__(self, norm: torch.nn.RMSNorm, rank: int, size: int, group: Any) -> None:
        super().__init__()
        (self.num_features,) = norm.normalized_shape
        index = shard_index([self.num_features], rank, size, None if norm.weight is None else norm.weight.device)
        self.weight = None if norm.weight is None else torch.nn.Parameter(
            norm.weight.detach().index_select(0, index), requires_grad=norm.weight.requires_grad)
        self.eps = norm.eps
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        upcast = x.float()
        squares = upcast.square().sum(dim=-1, keepdim=True)
        dist.all_reduce(squares, group=self.group)
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        out = upcast * torch.rsqrt(squares / self.num_features + eps)
        return (out if self.weight is None else out * self.weight).type_as(x)

    def extra_repr(self) -> str:
        return f"{self.num_features} features (a shard of them here), eps={self.eps}"


class GatheredLinear(torch.nn.Module):
    """A Linear layer's contiguous slice of output features whose output every rank needs whole:
    the ranks' slices are all-gathered over `group`, in rank order (the pieces are equal, checked)."""

    def __init__(self, linear: torch.nn.Linear, rank: int, size: int, group: Any) -> None:
        super().__init__()
        self.shard = column_shard(linear, rank, size)
        self.size, self.group = size, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        piece = self.shard(x).contiguous()
        pieces = [torch.empty_like(piece) for _ in range(self.size)]
        dist.all_gather(pieces, piece, group=self.group)
        return torch.cat(pieces, dim=-1)
