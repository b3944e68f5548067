"""Splitting a transformer's token sequences over the sequence-parallel ranks, padding a count
the ranks do not divide (sequence_parallel.py installs it).

The context-parallel plan (`SequencePlan.plan`) names the inputs to split and the outputs to
gather; the hooks here are diffusers' own split and gather hooks (registered through its
HookRegistry, as `apply_context_parallel` does), with two additions for a family whose plan
`pads`: before the split, every split tensor gets zero rows at the end of its sequence up to a
multiple of the ranks (so "a red fox", 59 text tokens, splits 30 + 30 at degree 2), and after
the gather the padding rows are dropped again. The padding never reaches a result: it is
masked out of the attention keys (`SplitSequence.key_mask`, which the family's attention
processor passes to ring_attention.py), and its query rows, computed like any token (every
other layer is per token), are the rows the gather drops.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from omnistage.diffusion.accel.ring_attention import sequence_parallel_attention


class SplitSequence:
    """One transformer's split: the ranks, and per forward the real tokens of each split sequence."""

    def __init__(self, groups: Any, ways: int, cp_config: Any):
        self.groups = groups
        self.ways = ways
        self.cp_config = cp_config
        """diffusers' ContextParallelConfig, set up: its flattened mesh is the one the plan's gather hooks use."""
        self.lengths: dict[str, int] = {}
        self._real: dict[str, torch.Tensor] = {}
        self._masks: dict[tuple[str, ...], torch.Tensor | None] = {}

    def record(self, lengths: dict[str, int], token_masks: dict[str, torch.Tensor], batch: int,
               device: torch.device) -> None:
        """This forward's token counts by sequence (before padding) and any masks of their own
        (bool/int [B, count], 0 = a padding token of the request's, e.g. batched prompts)."""
        self.lengths, self._masks = lengths, {}
        self._real = {}
        if not token_masks and all(n % self.ways == 0 for n in lengths.values()):
            return  # nothing to mask: the attention runs without a mask
        for name, count in lengths.items():
            real = (torch.arange(padded_count(count, self.ways), device=device) < count).expand(batch, -1)
            if name in token_masks:
                real = real & pad_rows(token_masks[name].to(device=device, dtype=torch.bool), 1, self.ways)
            self._real[name] = real

    @property
    def gathered_length(self) -> int | None:
        """The real length of the sequence the plan gathers (the first of `split_lengths`)."""
        return next(iter(self.lengths.values()), None)

    def key_mask(self, *names: str) -> torch.Tensor | None:
        """bool [B, all ranks' tokens] (False = padding) over a joint sequence each rank holds as its
        chunks of `names` concatenated in that order, ranks in mesh order (ring-major, as
        ring_attention.py and the Ulysses exchange lay them out); None when nothing is masked."""
        if not self._real:
            return None
        if names not in self._masks:
            chunks = [self._real[name].chunk(self.ways, dim=1) for name in names]
            self._masks[names] = torch.cat([c for rank in zip(*chunks) for c in rank], dim=1)
        return self._masks[names]

    def shard(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's chunk of `x` along `dim`, padded as the split hooks pad it (ranks in mesh order,
        ring-major, as diffusers' sharder takes them)."""
        ring, ulysses = self.groups.sequence_mesh.get_coordinate()
        return pad_rows(x, dim, self.ways).chunk(self.ways, dim=dim)[ring * self.groups.degrees.ulysses + ulysses]

    def trim(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """`x`, a gathered sequence, without the padding rows the split added."""
        length = self.gathered_length
        return x if length is None else x.narrow(dim, 0, length)

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """The whole sequence from this rank's chunk `x` along `dim`, as the plan's gather hooks return it."""
        from diffusers.hooks.context_parallel import EquipartitionSharder

        return self.trim(EquipartitionSharder.unshard(x, dim, self.cp_config._flattened_mesh), dim)

    def shard_mask(self, *names: str) -> torch.Tensor | None:
        """bool [B, this rank's tokens] in this forward (False = padding) over this rank's chunks of the
        sequences `names` concatenated in that order, or None when nothing is padded."""
        if not self._real:
            return None
        return torch.cat([self.shard(self._real[name], 1) for name in names], dim=1)

    def sum_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """`values` summed over the ranks that split the sequence (in place)."""
        import torch.distributed as dist

        for dim, degree in (("ulysses", self.groups.degrees.ulysses), ("ring", self.groups.degrees.ring)):
            if degree > 1:
                dist.all_reduce(values, group=self.groups.mesh[dim].get_group())
        return values

    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *names: str) -> torch.Tensor:
        """Attention for this rank's chunk ([B, S, H, D]) of the joint sequence of `names`."""
        return sequence_parallel_attention(query, key, value, self.key_mask(*names), self.groups)


def padded_count(count: int, ways: int) -> int:
    return -(-count // ways) * ways


def pad_rows(x: torch.Tensor, dim: int, ways: int) -> torch.Tensor:
    """`x` with zero rows appended along `dim` up to a multiple of `ways` (any dtype: masks, complex RoPE)."""
    missing = padded_count(x.shape[dim], ways) - x.shape[dim]
    if not missing:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def apply_plan(model: Any, cp_config: Any, plan: dict, split: SplitSequence) -> None:
    """diffusers' `apply_context_parallel`, with the padding split and trimming gather hooks."""
    from diffusers.hooks import HookRegistry
    from diffusers.hooks.context_parallel import ContextParallelGatherHook, ContextParallelSplitHook
    from diffusers.models._modeling_parallel import ContextParallelOutput

    class PaddedSplitHook(ContextParallelSplitHook):
        def _prepare_cp_input(self, x: torch.Tensor, cp_input: Any) -> torch.Tensor:
            if cp_input.expected_dims is None or x.dim() == cp_input.expected_dims:
                x = pad_rows(x, cp_input.split_dim, split.ways)
            return super()._prepare_cp_input(x, cp_input)

    class TrimmedGatherHook(ContextParallelGatherHook):
        def post_forward(self, module: Any, output: Any) -> Any:
            output = super().post_forward(module, output)
            outputs = [output] if isinstance(output, torch.Tensor) else list(output)
            trimmed = [x if cpm is None else split.trim(x, cpm.gather_dim) for x, cpm in zip(outputs, self.metadata)]
            return trimmed[0] if isinstance(output, torch.Tensor) else type(output)(trimmed)

    for module_id, entry in plan.items():
        for module in _submodules(model, module_id):
            registry = HookRegistry.check_if_exists_or_initialize(module)
            if isinstance(entry, dict):
                registry.register_hook(PaddedSplitHook(entry, cp_config), f"cp_input---{module_id}")
            else:
                outputs = [entry] if isinstance(entry, ContextParallelOutput) else list(entry)
                registry.register_hook(TrimmedGatherHook(outputs, cp_config), f"cp_output---{module_id}")


def _submodules(model: Any, module_id: str) -> list[Any]:
    """The modules a plan key names: a dotted path, "" for the model, "*" for each item of a list."""
    pattern = re.compile(r"[^.]+".join(re.escape(part) for part in module_id.split("*")))
    found = [module for name, module in model.named_modules() if pattern.fullmatch(name)]
    if not found:
        raise ValueError(f"the sequence-parallel plan names {module_id!r}, which {type(model).__name__} does not have")
    return found
