"""OmniVoice's iterative unmasking, one step at a time over a batch of requests.

NOTE on the algorithm (the authors' `_generate_iterative`): every target code starts masked.
A step runs the network over each request twice, conditioned (style, text, reference, target)
and unconditioned (the target alone), combines their log-probabilities with CFG, predicts a
code for every position (greedy, or Gumbel-top-k sampled at `class_temperature`) and
unmasks the `k` most confident still-masked positions, `k` following a shifted time schedule
so that all are unmasked after `num_step` steps. Earlier codebooks are favoured
(`layer_penalty_factor`) and positions are picked with Gumbel noise at `position_temperature`.

Each request draws its noise from its own generator, so a request's codes do not depend on
what it is batched with; alone, a request seeded with `s` draws what the authors' `generate`
draws after `torch.manual_seed(s)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class UnmaskParams:
    """The authors' `OmniVoiceGenerationConfig` decoding fields, with their defaults."""

    num_step: int = 32
    guidance_scale: float = 2.0
    t_shift: float = 0.1
    layer_penalty_factor: float = 5.0
    position_temperature: float = 5.0
    class_temperature: float = 0.0


@dataclass
class UnmaskState:
    """One request: its conditional inputs, the target codes so far, and where it is in its schedule."""

    input_ids: torch.Tensor
    """[codebooks, S]: the conditional row; the target is its last `num_frames` positions."""
    audio_mask: torch.Tensor
    """[S] bool."""
    num_frames: int
    params: UnmaskParams
    generator: torch.Generator
    schedule: list[int] = field(default_factory=list)
    step_index: int = 0

    def __post_init__(self) -> None:
        if not self.schedule:
            self.schedule = unmask_schedule(self.num_frames * self.input_ids.shape[0], self.params)

    @property
    def codes(self) -> torch.Tensor:
        """[codebooks, num_frames]: the target (masked where not yet decided)."""
        return self.input_ids[:, -self.num_frames:]

    @property
    def is_done(self) -> bool:
        return self.step_index >= self.params.num_step


def unmask_schedule(total: int, params: UnmaskParams) -> list[int]:
    """How many positions each step unmasks (the last step takes the rest)."""
    t = torch.linspace(0.0, 1.0, params.num_step + 1)
    t = (params.t_shift * t / (1 + (params.t_shift - 1) * t)).tolist()
    left, out = total, []
    for step in range(params.num_step):
        k = left if step == params.num_step - 1 else min(math.ceil(total * (t[step + 1] - t[step])), left)
        out.append(int(k))
        left -= int(k)
    return out


def batch_rows(states: list[UnmaskState], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The conditioned rows (0..B-1) then the unconditioned ones (B..2B-1), right-padded with
    `pad_id` (the authors' pad: the mask code): input_ids [2B, C, L], audio_mask [2B, L], attention [2B, 1, L, L]. A
    padding position attends to itself only (an all-masked row would be NaN in SDPA)."""
    b, c = len(states), states[0].input_ids.shape[0]
    length = max(s.input_ids.shape[1] for s in states)
    device = states[0].input_ids.device
    ids = torch.full((2 * b, c, length), pad_id, dtype=torch.long, device=device)
    audio = torch.zeros((2 * b, length), dtype=torch.bool, device=device)
    attention = torch.zeros((2 * b, 1, length, length), dtype=torch.bool, device=device)
    for i, s in enumerate(states):
        n, t = s.input_ids.shape[1], s.num_frames
        ids[i, :, :n], audio[i, :n] = s.input_ids, s.audio_mask
        attention[i, :, :n, :n] = True
        ids[b + i, :, :t], audio[b + i, :t] = s.codes, s.audio_mask[-t:]
        attention[b + i, :, :t, :t] = True
        pad = torch.arange(t, length, device=device)
        attention[b + i, :, pad, pad] = True
    return ids, audio, attention


@torch.no_grad()
def unmask_step(model, states: list[UnmaskState]) -> None:
    """Advance every state by one step (one network call over their 2B rows)."""
    ids, audio, attention = batch_rows(states, model.mask_id)
    logits = model(ids, audio, attention)
    b = len(states)
    layer_ids = torch.arange(model.num_codebooks, device=logits.device).view(1, -1, 1)
    for i, s in enumerate(states):
        k = s.schedule[s.step_index]
        s.step_index += 1
        if k <= 0:
            continue
        n, t = s.input_ids.shape[1], s.num_frames
        pred, scores = _predict(logits[i:i + 1, :, n - t:n], logits[b + i:b + i + 1, :, :t], s, model.mask_id)
        scores = scores - layer_ids * s.params.layer_penalty_factor
        if s.params.position_temperature > 0.0:
            scores = _gumbel(scores, s.params.position_temperature, s.generator)
        target = s.codes.unsqueeze(0)
        scores.masked_fill_(target != model.mask_id, -float("inf"))
        chosen = torch.topk(scores.flatten(), k).indices
        flat = target.flatten().clone()
        flat[chosen] = pred.flatten()[chosen]
        s.input_ids[:, n - t:] = flat.view(target.shape[1:])


def _predict(cond: torch.Tensor, uncond: torch.Tensor, s: UnmaskState, mask_id: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each position's code and its confidence (the guided log-probability)."""
    if s.params.guidance_scale != 0:
        c, u = F.log_softmax(cond, dim=-1), F.log_softmax(uncond, dim=-1)
        log_probs = torch.log_softmax(c + s.params.guidance_scale * (c - u), dim=-1)
    else:
        log_probs = F.log_softmax(cond, dim=-1)
    log_probs[..., mask_id] = -float("inf")
    if s.params.class_temperature > 0.0:
        k = math.ceil(0.1 * log_probs.shape[-1])  # the authors' top 10% of the codes
        top, index = log_probs.topk(k, dim=-1)
        filtered = torch.full_like(log_probs, float("-inf")).scatter_(-1, index, top)
        pred = _gumbel(filtered, s.params.class_temperature, s.generator).argmax(dim=-1)
    else:
        pred = log_probs.argmax(dim=-1)
    return pred, log_probs.max(dim=-1)[0]


def _gumbel(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    u = torch.rand(logits.shape, generator=generator, device=generator.device).to(logits.device)
    return logits / temperature - torch.log(-torch.log(u + 1e-10) + 1e-10)
