"""Classifier-free guidance: which branches run, how they are batched, how they combine.

A family declares one `Guidance`; `guided_predictions` is the one function that runs it,
so CFG-parallel (the two branches on two ranks) later replaces this function alone.

- `scale(state)`: this step's guidance scale for a request, or None when its uncond
  branch does not run at this step (no negative prompt, CFG off, Z-Image's truncation).
- `combine(state, cond, uncond, scale)`: the family's rule (`plain_cfg`,
  `rescaled_true_cfg`, `norm_clamped_cfg` below).
- `batch_branches`: the cond and uncond rows share one transformer call (SD3, Z-Image, as
  diffusers batches them), else one call per branch (Qwen-Image, FLUX, Wan, as diffusers
  calls them), so a step cache keeps their states apart by branch.

Guidance-distilled models (FLUX.1-dev's `guidance_scale`) take the scale as a
transformer input and run no uncond branch: that is not CFG, and stays in the family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from omnistage.diffusion.pipeline import DenoiseState

Branch = Literal["cond", "uncond"]
Rows = list[tuple["DenoiseState", Branch]]
Predict = Callable[[Rows], list[torch.Tensor]]
"""A family's batched transformer call: one prediction per (state, branch) row, in order."""


@dataclass(frozen=True)
class Guidance:
    scale: Callable[["DenoiseState"], float | None]
    combine: Callable[["DenoiseState", torch.Tensor, torch.Tensor, float], torch.Tensor]
    batch_branches: bool = False


def scale_if_negative(key: str = "guidance_scale") -> Callable[["DenoiseState"], float | None]:
    """A `Guidance.scale` for families that encode a negative prompt only for the requests that
    run CFG: the state's `cond[key]` while it has negative prompt embeddings, else None."""
    return lambda state: state.cond[key] if state.cond["negative_prompt_embeds"] is not None else None


def guided_predictions(states: list[DenoiseState], predict: Predict, guidance: Guidance) -> list[torch.Tensor]:
    """Each state's guided noise prediction for its current step."""
    scales = [guidance.scale(s) for s in states]
    guided = [s for s, scale in zip(states, scales) if scale is not None]
    cond_rows: Rows = [(s, "cond") for s in states]
    uncond_rows: Rows = [(s, "uncond") for s in guided]
    if guidance.batch_branches:
        preds = predict(cond_rows + uncond_rows)
        cond, uncond = preds[: len(states)], preds[len(states):]
    else:
        cond = predict(cond_rows)
        uncond = predict(uncond_rows) if uncond_rows else []
    uncond_of = dict(zip(map(id, guided), uncond))
    return [c if scale is None else guidance.combine(s, c, uncond_of[id(s)], scale)
            for s, c, scale in zip(states, cond, scales)]


# -- the families' combine rules -------------------------------------------------------------


def plain_cfg(state: DenoiseState, cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """uncond + scale * (cond - uncond), in diffusers' operation order (SD3, FLUX true CFG, Wan)."""
    return uncond + scale * (cond - uncond)


def rescaled_true_cfg(state: DenoiseState, cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Qwen-Image's true CFG: guide, then rescale each token's prediction back to the cond
    prediction's norm."""
    combined = plain_cfg(state, cond, uncond, scale)
    cond_norm = torch.norm(cond, dim=-1, keepdim=True)
    combined_norm = torch.norm(combined, dim=-1, keepdim=True)
    return combined * (cond_norm / combined_norm)


def norm_clamped_cfg(state: DenoiseState, cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Z-Image's CFG extrapolates from the cond prediction, pos + s * (pos - neg), then caps
    each output's norm at `cfg_normalization` times the cond norm (0 = no cap)."""
    max_norm_ratio = state.cond["cfg_normalization"]
    rows = []
    for pos, neg in zip(cond, uncond):  # one latent (output) at a time, as diffusers does
        pred = pos + scale * (pos - neg)
        if max_norm_ratio > 0:
            max_norm = torch.linalg.vector_norm(pos) * max_norm_ratio
            new_norm = torch.linalg.vector_norm(pred)
            if new_norm > max_norm:
                pred = pred * (max_norm / new_norm)
        rows.append(pred)
    return torch.stack(rows)
