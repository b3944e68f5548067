"""A convolutional codec decoder's stream, voiced window by window so that chunked audio equals
the one-shot decode (up to float rounding).

An output frame's samples depend on the `context` frames around it (its receptive field,
`receptive_frames`): on the left only for a causal decoder, on both sides for one that is
not. A stream so decodes each window with `context` frames already voiced on its left and
cuts their samples; a non-causal decoder also holds back its last `context` frames (the
lookahead, `keep`) until more frames, or the end of the stream, arrive.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


def receptive_frames(decoder: torch.nn.Module, causal: bool) -> int:
    """How many frames on one side reach an output frame's samples, from the convolutions in
    forward order (each at its layer's rate: a transposed convolution multiplies it); a
    non-causal convolution reaches half its span on each side."""
    reach, rate = 0.0, 1
    for module in decoder.modules():
        if isinstance(module, torch.nn.ConvTranspose1d):
            reach += math.ceil(module.kernel_size[0] / module.stride[0]) / rate
            rate *= module.stride[0]
        elif isinstance(module, torch.nn.Conv1d):
            span = (module.kernel_size[0] - 1) * module.dilation[0]
            reach += (span if causal else span / 2) / rate
    return math.ceil(reach)


@dataclass
class ContextWindow:
    """One stream's frames around the next window, [channels, frames] on the decoder's device."""

    history: torch.Tensor | None = None
    """The last voiced frames (left context), at most `context` of them."""
    pending: torch.Tensor | None = None
    """Frames received, not voiced yet (the lookahead)."""

    def voice(self, decode: Callable[[torch.Tensor], torch.Tensor], new: torch.Tensor | None, *, context: int,
              keep: int, hop_length: int) -> np.ndarray:
        """Add `new` frames and voice all unvoiced frames but the last `keep`: `decode` maps
        [1, channels, frames] to [1, 1, frames * hop_length] samples."""
        parts = [t for t in (self.pending, new) if t is not None and t.shape[1]]
        todo = torch.cat(parts, dim=1) if parts else None
        num_voiced = 0 if todo is None else todo.shape[1] - keep
        if num_voiced <= 0:
            self.pending = todo
            return np.zeros(0, dtype=np.float32)
        left = 0 if self.history is None else self.history.shape[1]
        window = todo if self.history is None else torch.cat([self.history, todo], dim=1)
        wav = decode(window[None])[0, 0]
        out = wav[left * hop_length:(left + num_voiced) * hop_length]
        self.history = window[:, :left + num_voiced][:, -context:]
        self.pending = todo[:, num_voiced:]
        return out.float().cpu().numpy()
