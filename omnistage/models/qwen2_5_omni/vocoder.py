"""Token2wav's BigVGAN forward with its parameter-only terms computed once.

`Qwen2_5OmniToken2WavBigVGANModel.forward` runs 37 anti-aliased SnakeBeta activations (6
per AMP block, one after the last), and each recomputes `exp(alpha)`, `exp(beta)` and
`1 / (exp(beta) + eps)` from its parameters, through three module calls. A vocoder pass is
bound by per-op overhead on a small model (a 12-mel-frame pass costs most of a 34-frame
one), and it runs once per audio chunk, first audio included. `BigVGANPass` runs the same
ops on the same tensors in the same order, with those terms precomputed at load, so its
waveform is the reference's bit for bit (`tests/models/test_qwen2_5_omni_token2wav.py`).
Only the forwards are restated; the convolutions, filters and parameters are the model's own.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


class _Activation:
    """`Qwen2_5OmniAntiAliasedActivation1d` (up 2x, SnakeBeta, down 2x) with SnakeBeta's
    `exp(alpha)` and `1 / (exp(beta) + eps)` as tensors."""

    def __init__(self, module) -> None:
        act, self.up, self.down = module.act, module.upsample, module.downsample
        self.alpha = torch.exp(act.alpha.unsqueeze(0).unsqueeze(-1))
        self.inverse_beta = 1.0 / (torch.exp(act.beta.unsqueeze(0).unsqueeze(-1)) + act.no_div_by_zero)
        channels = act.in_features
        self.up_filter = self.up.filter.expand(channels, -1, -1)
        self.down_filter = self.down.filter.expand(channels, -1, -1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        up, down = self.up, self.down
        x = F.pad(x, (up.pad, up.pad), mode="replicate")
        x = up.ratio * F.conv_transpose1d(x, self.up_filter, stride=up.stride, groups=x.shape[1])
        x = x[..., up.pad_left:-up.pad_right]
        x = x + self.inverse_beta * torch.pow(torch.sin(x * self.alpha), 2)
        x = F.pad(x, (down.pad_left, down.pad_right), mode="replicate")
        return F.conv1d(x, self.down_filter, stride=down.stride, groups=x.shape[1])


class BigVGANPass:
    """mel [1, mel_dim, frames] -> waveform, as `vocoder(mel)` returns it (clamped, squeezed, on CPU)."""

    def __init__(self, vocoder) -> None:
        self.vocoder = vocoder
        with torch.inference_mode():
            self.block_activations = [[_Activation(a) for a in block.activations] for block in vocoder.resblocks]
            self.activation_post = _Activation(vocoder.activation_post)

    @torch.inference_mode()  # the precomputed terms are inference tensors
    def __call__(self, mel: torch.Tensor) -> torch.Tensor:
        v = self.vocoder
        hidden = v.conv_pre(self._normalized(mel))
        for layer in range(v.num_upsample_layers):
            hidden = v.ups[layer][0](hidden)
            blocks = range(layer * v.num_residual_blocks, (layer + 1) * v.num_residual_blocks)
            hidden = sum(self._amp_block(b, hidden) for b in blocks) / v.num_residual_blocks
        out = v.conv_post(self.activation_post(hidden))
        return torch.clamp(out, min=-1.0, max=1.0).squeeze().cpu()

    def _normalized(self, mel: torch.Tensor) -> torch.Tensor:
        """`process_mel_spectrogram`: log mel -> dB -> [-1, 1]."""
        amplitude = torch.exp(mel)
        min_level = torch.exp(torch.tensor(-115 / 20.0 * np.log(10), device=mel.device, dtype=mel.dtype))
        decibels = 20 * torch.log10(torch.clamp(amplitude, min=min_level)) - 20
        return torch.clamp(2 * ((decibels - -115) / 115) - 1, -1, 1)

    def _amp_block(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        block, acts = self.vocoder.resblocks[index], self.block_activations[index]
        for conv1, conv2, act1, act2 in zip(block.convs1, block.convs2, acts[::2], acts[1::2]):
            hidden = hidden + conv2(act2(conv1(act1(hidden))))
        return hidden
