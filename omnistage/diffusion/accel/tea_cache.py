"""`cache_backend: tea_cache`: TeaCache (arXiv 2411.19108). Before the first transformer
block, take its timestep-modulated input, add the relative L1 change since the request's
previous step, rescaled by the family's polynomial, to an accumulator; while the
accumulator stays under `rel_l1_thresh`, skip every block and reuse the residual of the
last computed step; past it, compute and reset. The first and last steps always compute.

Each family names its modulated input and coefficients (`BlockChain.modulated_input`,
`tea_cache_coefficients`, in the family's pipeline.py, with their source); families
without published coefficients use the distance as it is. The rescaled distance is
clamped at 0 (a fitted polynomial can dip below 0 on small distances), so
`rel_l1_thresh: 0` computes every step and gives the uncached output bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from omnistage.diffusion.accel.first_block_cache import block_chain
from omnistage.diffusion.accel.step_cache import BlockChain, BranchCache, Policy, StepCache, config_from, \
    fit_tokens, relative_l1

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.pipeline import DenoiseState

NAME = "tea_cache"


@dataclass(frozen=True)
class TeaCacheConfig:
    rel_l1_thresh: float = 0.2
    """Skip while the accumulated rescaled distance stays under this (vLLM-Omni's default)."""

    def problems(self) -> list[str]:
        if self.rel_l1_thresh < 0:
            return [f"cache_config.rel_l1_thresh: must be >= 0, got {self.rel_l1_thresh}"]
        return []


def from_deploy(deploy: StageDeployConfig) -> TeaCacheConfig | None:
    if deploy.cache_backend != NAME:
        return None
    return config_from(NAME, TeaCacheConfig, deploy.cache_config)


def apply(pipeline: Any, config: TeaCacheConfig) -> None:
    chain = block_chain(pipeline, NAME)
    if chain.modulated_input is None:
        raise ValueError(f"cache_backend: 'tea_cache' has no modulated-input extractor for "
                         f"{pipeline.reference_class}")
    pipeline.step_cache = StepCache(pipeline, chain, TeaCachePolicy(config, chain.tea_cache_coefficients), NAME)


class TeaCachePolicy(Policy):
    probe_head = False

    def __init__(self, config: TeaCacheConfig, coefficients: tuple[float, ...] | None):
        self.config = config
        self.coefficients = coefficients

    def rescale(self, distance: float) -> float:
        if self.coefficients is None:
            return distance
        value = 0.0
        for c in self.coefficients:  # highest power first, as numpy.poly1d (TeaCache's own code)
            value = value * distance + c
        return max(value, 0.0)

    def signal(self, chain: BlockChain, block: torch.nn.Module, args: tuple, kwargs: dict,
               head_output: torch.Tensor | None) -> torch.Tensor:
        return chain.modulated_input(block, args, kwargs)

    def _accumulated(self, cache: BranchCache, signal: torch.Tensor, mask: torch.Tensor | None) -> float:
        return cache.accumulated + self.rescale(relative_l1(signal, fit_tokens(cache.previous, signal), mask,
                                                                  self.split))

    def should_compute(self, cache: BranchCache, signal: torch.Tensor, mask: torch.Tensor | None,
                       state: DenoiseState) -> bool:
        if state.step_index in (0, state.num_steps - 1) or cache.previous is None or cache.residual is None:
            return True
        return not self._accumulated(cache, signal, mask) < self.config.rel_l1_thresh

    def update(self, cache: BranchCache, signal: torch.Tensor, mask: torch.Tensor | None,
               state: DenoiseState, compute: bool) -> None:
        cache.accumulated = 0.0 if compute else self._accumulated(cache, signal, mask)
        cache.previous = signal
