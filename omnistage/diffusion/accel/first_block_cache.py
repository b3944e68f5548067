"""`cache_backend: first_block_cache`: run the first transformer block, compare its residual
(output minus input) with the one of the request's last computed step, and while the
relative L1 change stays under `threshold` reuse that step's residual of the remaining
blocks instead of running them (ParaAttention's First-Block Cache; diffusers'
hooks/first_block_cache.py does the same for one request at a time).

Per request and per branch (cond / uncond have their own residuals), deciding per
request in a batch (step_cache.py). `warmup_steps` first steps always compute.
`threshold: 0` computes every step and gives the uncached output bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from omnistage.diffusion.accel.step_cache import BlockChain, BranchCache, Policy, StepCache, config_from, \
    fit_tokens, relative_l1, threshold_problems

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.pipeline import DenoiseState

NAME = "first_block_cache"


@dataclass(frozen=True)
class FirstBlockCacheConfig:
    threshold: float = 0.05
    """Reuse the tail's residual while the first block's residual changed (relative L1) by less."""
    warmup_steps: int = 1
    """First steps of every request that always compute."""

    def problems(self) -> list[str]:
        return threshold_problems(self.threshold, self.warmup_steps)


def from_deploy(deploy: StageDeployConfig) -> FirstBlockCacheConfig | None:
    if deploy.cache_backend != NAME:
        return None
    return config_from(NAME, FirstBlockCacheConfig, deploy.cache_config)


def apply(pipeline: Any, config: FirstBlockCacheConfig) -> None:
    chain = block_chain(pipeline, NAME)
    pipeline.step_cache = StepCache(pipeline, chain, FirstBlockPolicy(config), NAME)


def block_chain(pipeline: Any, backend: str) -> BlockChain:
    chain = getattr(pipeline, "step_cache_blocks", None)
    if chain is None:
        raise ValueError(f"cache_backend: {backend!r} needs a native pipeline that names its transformer "
                         f"blocks; {pipeline.reference_class} does not (the generic adapter runs diffusers' "
                         "own loop; LTX-2's audio-video blocks have no cache hook)")
    return chain


class FirstBlockPolicy(Policy):
    probe_head = True

    def __init__(self, config: FirstBlockCacheConfig):
        self.config = config

    def signal(self, chain: BlockChain, block: torch.nn.Module, args: tuple, kwargs: dict,
               head_output: torch.Tensor | None) -> torch.Tensor:
        return head_output

    def should_compute(self, cache: BranchCache, signal: torch.Tensor, mask: torch.Tensor | None,
                       state: DenoiseState) -> bool:
        if state.step_index < self.config.warmup_steps or cache.previous is None or cache.residual is None:
            return True
        return not relative_l1(signal, fit_tokens(cache.previous, signal), mask, self.split) < self.config.threshold

    def update(self, cache: BranchCache, signal: torch.Tensor, mask: torch.Tensor | None,
               state: DenoiseState, compute: bool) -> None:
        if compute:  # compared with the last computed step, so slow drift still adds up
            cache.previous = signal
