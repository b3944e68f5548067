"""`cache_backend: cache_dit`: cache-dit's DBCache (the optional `cache-dit` package) on our
native transformer, through its public API: `cache_dit.enable_cache(transformer,
cache_config=DBCacheConfig(...), calibrator_config=TaylorSeerCalibratorConfig(...))`, the
transformer-only form, where cache-dit's registry knows the transformer class (ours are
diffusers' own classes: Qwen-Image, FLUX, Z-Image, Wan), else a `cache_dit.BlockAdapter` over
the blocks the family names (`step_cache_blocks`; SD3's transformer is only registered
under its pipeline's name). `Fn_compute_blocks` first and `Bn_compute_blocks` last
blocks always run; the middle ones are reused while the Fn blocks' residual changed by
less than `residual_diff_threshold`; `max_warmup_steps` first steps always compute;
`enable_taylorseer` predicts the reused residual by a Taylor series instead of copying it.

NOTE: cache-dit keeps one cache context per transformer, not per request, and counts steps
by transformer calls (cond then uncond with `enable_separate_cfg`). So this backend runs
one request at a time (`max_num_seqs: 1`, checked at start-up), and refreshes the context
(`cache_dit.refresh_context`) when a request takes its first step, with that request's
step count and whether it runs a separate uncond call. For requests batched or at
different steps, use `first_block_cache` or `tea_cache`, whose state is per request.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from omnistage.diffusion.accel.first_block_cache import block_chain
from omnistage.diffusion.accel.step_cache import StepCacheState, config_from

if TYPE_CHECKING:
    import torch

    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.guidance import Guidance, Predict
    from omnistage.diffusion.pipeline import DenoiseState

NAME = "cache_dit"


@dataclass(frozen=True)
class CacheDitConfig:
    """DBCache's options under cache-dit's own names (DBCacheConfig, TaylorSeerCalibratorConfig)."""

    Fn_compute_blocks: int = 1  # noqa: N815 - cache-dit's names
    """First blocks that always run; their residual decides."""
    Bn_compute_blocks: int = 0  # noqa: N815
    """Last blocks that always run."""
    residual_diff_threshold: float = 0.24
    """Reuse the middle blocks while the Fn residual changed by less (vLLM-Omni's default)."""
    max_warmup_steps: int = 8
    """First steps that always compute (cache-dit's default)."""
    max_cached_steps: int = -1
    """Most steps reused per request; -1 = no limit."""
    max_continuous_cached_steps: int = -1
    """Most consecutive steps reused; -1 = no limit."""
    enable_taylorseer: bool = False
    """Predict reused residuals with TaylorSeer instead of copying them."""
    taylorseer_order: int = 1

    def problems(self) -> list[str]:
        out = [f"cache_config.{name}: must be >= {low}, got {getattr(self, name)}"
               for name, low in (("Fn_compute_blocks", 1), ("Bn_compute_blocks", 0), ("max_warmup_steps", 0),
                                 ("max_cached_steps", -1), ("max_continuous_cached_steps", -1),
                                 ("taylorseer_order", 1))
               if getattr(self, name) < low]
        if self.residual_diff_threshold < 0:
            out.append(f"cache_config.residual_diff_threshold: must be >= 0, got {self.residual_diff_threshold}")
        return out


def from_deploy(deploy: StageDeployConfig) -> CacheDitConfig | None:
    if deploy.cache_backend != NAME:
        return None
    config = config_from(NAME, CacheDitConfig, deploy.cache_config)
    if importlib.util.find_spec("cache_dit") is None:
        raise ValueError("cache_backend: 'cache_dit' needs the cache-dit package (pip install 'omnistage[cache-dit]')")
    if deploy.max_num_seqs != 1:
        raise ValueError(f"max_num_seqs: cache_backend 'cache_dit' keeps one cache per transformer, not per "
                         f"request, so it runs one request at a time; set max_num_seqs: 1 (got "
                         f"{deploy.max_num_seqs}) or use first_block_cache / tea_cache")
    split = [f"{name}={value}" for name, value in (("ulysses_degree", deploy.ulysses_degree),
                                                    ("ring_degree", deploy.ring_degree)) if value > 1]
    if split:  # its hooks compare a block's whole input with its output on a rank's shard, and fail
        raise ValueError(f"cache_backend=cache_dit cannot be combined with {', '.join(split)}: cache-dit's hooks "
                         "would see a rank's shard of the sequence")
    return config


def apply(pipeline: Any, config: CacheDitConfig) -> None:
    import cache_dit

    chain = block_chain(pipeline, NAME)
    transformers = [t for t in (getattr(pipeline, a, None) for a in chain.transformers) if t is not None]
    adapter = CacheDitAdapter(transformers, config, pipeline.guidance)
    for transformer in transformers:
        options = adapter.options(num_steps=None, separate_cfg=False)
        if cache_dit.BlockAdapterRegister.is_supported(transformer):
            cache_dit.enable_cache(transformer, **options)
        elif chain.io == "dual_stream":  # blocks take (hidden, encoder) and return (encoder, hidden)
            blocks = [getattr(transformer, name) for name in chain.blocks]
            cache_dit.enable_cache(cache_dit.BlockAdapter(
                transformer=transformer, blocks=blocks, forward_pattern=[cache_dit.ForwardPattern.Pattern_1] * len(blocks),
                check_forward_pattern=True), **options)
        else:
            raise ValueError(f"cache_backend: cache-dit does not know {type(transformer).__name__} of "
                             f"{pipeline.reference_class}")
    pipeline.step_cache = adapter
    pipeline.guidance_runner = partial(_cached_guidance, inner=pipeline.guidance_runner, adapter=adapter)


class CacheDitAdapter:
    def __init__(self, transformers: list[torch.nn.Module], config: CacheDitConfig, guidance: Guidance | None):
        self.transformers = transformers
        self.config = config
        self.guidance = guidance

    def options(self, num_steps: int | None, separate_cfg: bool) -> dict[str, Any]:
        from cache_dit import DBCacheConfig, TaylorSeerCalibratorConfig

        c = self.config
        options: dict[str, Any] = {"cache_config": DBCacheConfig(
            Fn_compute_blocks=c.Fn_compute_blocks, Bn_compute_blocks=c.Bn_compute_blocks,
            residual_diff_threshold=c.residual_diff_threshold, max_warmup_steps=c.max_warmup_steps,
            max_cached_steps=c.max_cached_steps, max_continuous_cached_steps=c.max_continuous_cached_steps,
            enable_separate_cfg=separate_cfg, num_inference_steps=num_steps)}
        if c.enable_taylorseer:
            options["calibrator_config"] = TaylorSeerCalibratorConfig(taylorseer_order=c.taylorseer_order)
        return options

    def start(self, state: DenoiseState) -> None:
        """A fresh cache context for `state`, which takes its first step."""
        import cache_dit

        # A separate uncond call per step when the family splits branches and this request guides.
        separate_cfg = (self.guidance is not None and not self.guidance.batch_branches
                        and self.guidance.scale(state) is not None)
        for transformer in self.transformers:
            cache_dit.refresh_context(transformer, **self.options(state.num_steps, separate_cfg))

    def num_cached_calls(self) -> tuple[int, int]:
        """(cond or batched calls, separate uncond calls) cache-dit reused in the current context."""
        import cache_dit

        cached = cfg_cached = 0
        for transformer in self.transformers:
            stats = cache_dit.summary(transformer, logging=False)[0]  # the transformer's own context
            cached += len(stats.cached_steps or [])
            cfg_cached += len(stats.cfg_cached_steps or [])
        return cached, cfg_cached

    def count(self, state: DenoiseState, before: tuple[int, int]) -> None:
        """Add to `state` the forwards cache-dit reused in this step's calls: a reused batched
        call skips each of its branches (SD3, Z-Image run cond and uncond in one call)."""
        cached, cfg_cached = (a - b for a, b in zip(self.num_cached_calls(), before))
        if self.guidance is not None and self.guidance.batch_branches:
            cached *= 2 if self.guidance.scale(state) is not None else 1
        if state.step_cache is None:
            state.step_cache = StepCacheState()
        state.step_cache.num_skipped += cached + cfg_cached


def _cached_guidance(states: list[DenoiseState], predict: Predict, guidance: Guidance, *, inner: Any,
                     adapter: CacheDitAdapter) -> list[torch.Tensor]:
    if len(states) != 1:
        raise RuntimeError(f"cache_backend 'cache_dit' runs one request at a time, got {len(states)}")
    (state,) = states
    if state.step_index == 0:
        adapter.start(state)
        before = (0, 0)  # a fresh context (the stats cache-dit leaves on the module are the last request's)
    else:
        before = adapter.num_cached_calls()
    preds = inner(states, predict, guidance)
    adapter.count(state, before)
    return preds
