"""M-RoPE positions of a Qwen omni thinker's batch, from any cached position (chunks, prefix-cache hits)."""

from __future__ import annotations

import torch

from omnistage.ar.model import ModelInput


def mrope_positions(batch: ModelInput) -> torch.Tensor:
    """[3, B, T] M-RoPE positions of an omni thinker's batch: the prompt's own in it, position +
    rope_delta after it (decode, or a prefill recomputing generated tokens after a preemption).
    A prefill row may start at any cached position (chunks, prefix-cache hits). Shared by the
    Qwen omni thinkers, whose `ThinkerState`s both carry `mrope_positions` and `rope_delta`."""
    states = [s.model_state for s in batch.seqs]
    if batch.is_prefill:
        pos = batch.positions.new_zeros(3, *batch.positions.shape)
        for i, st in enumerate(states):
            start, n, prompt_len = batch.context_lens[i], batch.query_lens[i], st.mrope_positions.shape[1]
            split = max(0, min(n, prompt_len - start))  # this row's positions inside the prompt
            pos[:, i, :split] = st.mrope_positions[:, start:start + split]
            pos[:, i, split:n] = batch.positions[i, split:n] + st.rope_delta
        return pos
    delta = torch.tensor([st.rope_delta for st in states], device=batch.positions.device)
    return (batch.positions + delta[:, None]).expand(3, -1, -1)
