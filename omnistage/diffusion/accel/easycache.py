"""`cache_backend: easycache`: EasyCache (Zhou et al. 2025, "Less is Enough: Training-Free
Video Diffusion Acceleration via Runtime-Adaptive Caching", arXiv 2507.02860). Calibration
free: where TeaCache needs a polynomial fitted per model, EasyCache measures at run time how
strongly the transformer's blocks turn a change of their input into a change of their output.

After two computed steps c' < c of a request it knows the transformation rate
    k = mean |out_c - out_c'| / mean |in_c - in_c'|
(in: the hidden states entering the first block; out: those leaving the last). On each later
step t it predicts the output's relative change from the input's,
    k * mean |in_t - in_{t-1}| / mean |out_c|,
adds it to an accumulator and, while the accumulator stays under `threshold`, skips every
block and reuses the last computed step's out - in; past it, it computes, resets the
accumulator and updates k. The first `warmup_steps` and the last step always compute.

The paper caches around the whole transformer (latents in, prediction out); here, as for
TeaCache, in and out are the block chain's (step_cache.py), so the embeddings and output
layers run every step and a request's state is per transformer and CFG branch. The
predicted change is never negative, so `threshold: 0` computes every step and gives the
uncached output bit for bit.
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

NAME = "easycache"


@dataclass(frozen=True)
class EasyCacheConfig:
    threshold: float = 0.025
    """Skip while the accumulated predicted relative output change stays under this (the
    paper's tau; 0.025 is its HunyuanVideo setting)."""
    warmup_steps: int = 5
    """First steps of every request that always compute (the paper's 5 of 50)."""

    def problems(self) -> list[str]:
        return threshold_problems(self.threshold, self.warmup_steps)


def from_deploy(deploy: StageDeployConfig) -> EasyCacheConfig | None:
    if deploy.cache_backend != NAME:
        return None
    return config_from(NAME, EasyCacheConfig, deploy.cache_config)


def apply(pipeline: Any, config: EasyCacheConfig) -> None:
    pipeline.step_cache = StepCache(pipeline, block_chain(pipeline, NAME), EasyCachePolicy(config), NAME)


class EasyCachePolicy(Policy):
    probe_head = False

    def __init__(self, config: EasyCacheConfig):
        self.config = config

    def signal(self, chain: BlockChain, block: torch.nn.Module, args: tuple, kwargs: dict,
               head_output: torch.Tensor | None) -> torch.Tensor:
        return chain.hidden(args, kwargs)

    def _predicted(self, cache: BranchCache, signal: torch.Tensor, mask: torch.Tensor | None) -> float:
        """The output's relative change since the previous step, predicted from the input's."""
        change = mean_abs(signal - fit_tokens(cache.previous, signal), mask, self.split)
        return cache.rate * change / max(mean_abs(fit_tokens(cache.output, signal), mask, self.split), 1e-12)

    def should_compute(self, cache: BranchCache, signal: torch.Tensor, mask: torch.Tensor | None,
                       state: DenoiseState) -> bool:
        if (state.step_index < self.config.warmup_steps or state.step_index == state.num_steps - 1
                or cache.rate is None or cache.previous is None or cache.residual is None):
            return True
        return not cache.accumulated + self._predicted(cache, signal, mask) < self.config.threshold

    def update(self, cache: BranchCache, signal: torch.Tensor, mask: torch.Tensor | None,
               state: DenoiseState, compute: bool) -> None:
        cache.accumulated = 0.0 if compute else cache.accumulated + self._predicted(cache, signal, mask)
        cache.previous = signal

    def computed(self, cache: BranchCache, reference: torch.Tensor, output: torch.Tensor,
                 mask: torch.Tensor | None) -> None:
        if cache.output is not None:
            # The last computed step's input is its output minus its residual (not kept twice).
            before_out = fit_tokens(cache.output, output)
            before_in = before_out - fit_tokens(cache.residual, output)
            input_change = mean_abs(reference - before_in, mask, self.split)
            # Equal inputs give equal outputs: nothing to predict from, so compute again.
            cache.rate = mean_abs(output - before_out, mask, self.split) / input_change if input_change > 0 else None
        cache.output = output
