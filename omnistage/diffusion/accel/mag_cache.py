"""`cache_backend: mag_cache`: MagCache (Ma et al. 2025, "MagCache: Fast Video Generation with
Magnitude-Aware Cache", arXiv 2506.09045), without its calibration run.

MagCache observes that the magnitude of the blocks' residual (output minus input) changes from
one step to the next by a ratio gamma_t = mean |r_t| / mean |r_{t-1}| that stays near 1 and
falls smoothly. Skipping step t and reusing r_{t-1} errs by about |1 - gamma_t|; over skipped
steps the ratios multiply and the errors add:
    ratio *= gamma_t;  error += |1 - ratio|
and the step computes again once `error` would reach `threshold` or `max_skip_steps` steps in
a row were skipped. The paper reads gamma_t from one calibration run per model; here it is
measured per request while it runs: after two computed steps c' < c the per-step ratio is
    gamma = (mean |r_c| / mean |r_c'|) ** (1 / (c - c')),
taken for the steps up to the next computed one (the ratio is smooth, so the last one
predicts the next). The first `warmup_steps` and the last step always compute.

As for TeaCache and EasyCache, the residual is the block chain's (step_cache.py), and the
state is per request, transformer and CFG branch. The predicted error is never negative,
so `threshold: 0` computes every step and gives the uncached output bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from omnistage.diffusion.accel.first_block_cache import block_chain
from omnistage.diffusion.accel.step_cache import BlockChain, BranchCache, Policy, StepCache, config_from, \
    fit_tokens, mean_abs, threshold_problems

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.pipeline import DenoiseState

NAME = "mag_cache"


@dataclass(frozen=True)
class MagCacheConfig:
    threshold: float = 0.06
    """Skip while the accumulated error |1 - ratio| stays under this (diffusers' MagCache default)."""
    warmup_steps: int = 5
    """First steps of every request that always compute (they also measure the first ratio)."""
    max_skip_steps: int = 4
    """Most steps skipped in a row (the paper's K)."""

    def problems(self) -> list[str]:
        out = threshold_problems(self.threshold, self.warmup_steps)
        if self.max_skip_steps < 1:
            out.append(f"cache_config.max_skip_steps: must be >= 1, got {self.max_skip_steps}")
        return out


def from_deploy(deploy: StageDeployConfig) -> MagCacheConfig | None:
    if deploy.cache_backend != NAME:
        return None
    return config_from(NAME, MagCacheConfig, deploy.cache_config)


def apply(pipeline: Any, config: MagCacheConfig) -> None:
    pipeline.step_cache = StepCache(pipeline, block_chain(pipeline, NAME), MagCachePolicy(config), NAME)


class MagCachePolicy(Policy):
    probe_head = False

    def __init__(self, config: MagCacheConfig):
        self.config = config

    def signal(self, chain: BlockChain, block: torch.nn.Module, args: tuple, kwargs: dict,
               head_output: torch.Tensor | None) -> torch.Tensor:
        return chain.hidden(args, kwargs)  # unused: the decision needs only the measured ratio

    def should_compute(self, cache: BranchCache, signal: torch.Tensor, mask: torch.Tensor | None,
                       state: DenoiseState) -> bool:
        if (state.step_index < self.config.warmup_steps or state.step_index == state.num_steps - 1
                or cache.rate is None or cache.residual is None or cache.skipped >= self.config.max_skip_steps):
            return True
        return not cache.accumulated + abs(1.0 - cache.ratio * cache.rate) < self.config.threshold

    def update(self, cache: BranchCache, signal: torch.Tensor, mask: torch.Tensor | None,
               state: DenoiseState, compute: bool) -> None:
        if compute:
            cache.gap, cache.skipped, cache.ratio, cache.accumulated = cache.skipped + 1, 0, 1.0, 0.0
        else:
            cache.ratio *= cache.rate
            cache.accumulated += abs(1.0 - cache.ratio)
            cache.skipped += 1

    def computed(self, cache: BranchCache, reference: torch.Tensor, output: torch.Tensor,
                 mask: torch.Tensor | None) -> None:
        if cache.residual is None:
            return
        before = mean_abs(fit_tokens(cache.residual, output), mask, self.split)
        now = mean_abs(output - reference, mask, self.split)
        cache.rate = (now / before) ** (1.0 / cache.gap) if before > 0 and now > 0 else None
