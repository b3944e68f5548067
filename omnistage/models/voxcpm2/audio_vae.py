"""VoxCPM2's audio VAE (`audiovae.safetensors` or `audiovae.pth`): a causal DAC-style encoder
(16 kHz audio -> latents) and decoder (latents -> 48 kHz audio, conditioned on the output rate).

Every convolution is causal (left-padded; a transposed one trimmed on the right), so an output
sample depends only on latents at or before it: its receptive field of history
(`talker_codec.window.receptive_frames`) makes a window's decode equal the one-shot decode,
which is how the codec stage streams (codec.py).

The checkpoint stores weight-normed convolutions (`weight_g`, `weight_v`); they are folded into
plain weights at load (`fold_weight_norm`), as inference never changes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class AudioVAEConfig:
    """`config.json`'s `audio_vae_config`; a checkpoint without one gets the authors' class defaults."""

    encoder_dim: int = 128
    encoder_rates: list[int] = field(default_factory=lambda: [2, 5, 8, 8])
    latent_dim: int = 64
    decoder_dim: int = 2048
    decoder_rates: list[int] = field(default_factory=lambda: [8, 6, 5, 2, 2, 2])
    depthwise: bool = True
    sample_rate: int = 16000
    out_sample_rate: int = 48000
    use_noise_block: bool = False
    sr_bin_boundaries: list[int] | None = field(default_factory=lambda: [20000, 30000, 40000])
    cond_type: str = "scale_bias"
    cond_dim: int = 128
    cond_out_layer: bool = False

    @classmethod
    def from_dict(cls, d: dict | None) -> AudioVAEConfig:
        config = cls(**{k: v for k, v in (d or {}).items() if k in {f.name for f in fields(cls)}})
        if config.use_noise_block:
            raise ValueError("VoxCPM2 audio VAE: use_noise_block (a random decoder) is not supported")
        if config.sr_bin_boundaries is not None and (config.cond_type not in ("scale_bias", "scale_bias_init")
                                                     or config.cond_out_layer):
            raise ValueError(f"VoxCPM2 audio VAE: cond_type={config.cond_type!r} "
                             f"(cond_out_layer={config.cond_out_layer}) is not supported")
        return config

    @property
    def hop_length(self) -> int:
        """Input samples per latent step."""
        return math.prod(self.encoder_rates)

    @property
    def decode_hop_length(self) -> int:
        """Output samples per latent step."""
        return math.prod(self.decoder_rates)


class CausalConv1d(nn.Conv1d):
    def __init__(self, *args, padding: int = 0, output_padding: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.left_pad = padding * 2 - output_padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.left_pad, 0)))


class CausalConvTranspose1d(nn.ConvTranspose1d):
    def __init__(self, *args, padding: int = 0, output_padding: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.right_trim = padding * 2 - output_padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)[..., :-self.right_trim]


class Snake1d(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, groups: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(dim), CausalConv1d(dim, dim, kernel_size=7, dilation=dilation, padding=3 * dilation, groups=groups),
            Snake1d(dim), CausalConv1d(dim, dim, kernel_size=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


def _strided(cls, n_in: int, n_out: int, stride: int) -> nn.Module:
    return cls(n_in, n_out, kernel_size=2 * stride, stride=stride, padding=math.ceil(stride / 2),
               output_padding=stride % 2)


class Encoder(nn.Module):
    def __init__(self, c: AudioVAEConfig) -> None:
        super().__init__()
        d = c.encoder_dim
        blocks: list[nn.Module] = [CausalConv1d(1, d, kernel_size=7, padding=3)]
        for stride in c.encoder_rates:
            groups = d if c.depthwise else 1
            blocks.append(Block(*(ResidualUnit(d, dilation, groups) for dilation in (1, 3, 9)), Snake1d(d),
                                _strided(CausalConv1d, d, 2 * d, stride)))
            d *= 2
        self.block = nn.Sequential(*blocks)
        self.fc_mu = CausalConv1d(d, c.latent_dim, kernel_size=3, padding=1)
        self.fc_logvar = CausalConv1d(d, c.latent_dim, kernel_size=3, padding=1)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        """[B, 1, samples] -> the latent means [B, D, steps]."""
        return self.fc_mu(self.block(audio))


class Block(nn.Module):
    """Layers in a `block` Sequential: the authors' encoder / decoder blocks (their tensor names)."""

    def __init__(self, *layers: nn.Module) -> None:
        super().__init__()
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Decoder(nn.Module):
    def __init__(self, c: AudioVAEConfig) -> None:
        super().__init__()
        d_in = c.latent_dim
        if c.depthwise:
            layers: list[nn.Module] = [CausalConv1d(d_in, d_in, kernel_size=7, padding=3, groups=d_in),
                                       CausalConv1d(d_in, c.decoder_dim, kernel_size=1)]
        else:
            layers = [CausalConv1d(d_in, c.decoder_dim, kernel_size=7, padding=3)]
        cond: list[nn.Module | None] = [None] * len(layers)
        for i, stride in enumerate(c.decoder_rates):
            n_in, n_out = c.decoder_dim // 2 ** i, c.decoder_dim // 2 ** (i + 1)
            groups = n_out if c.depthwise else 1
            layers.append(Block(Snake1d(n_in), _strided(CausalConvTranspose1d, n_in, n_out, stride),
                                *(ResidualUnit(n_out, dilation, groups) for dilation in (1, 3, 9))))
            cond.append(RateCondition(n_in, len(c.sr_bin_boundaries) + 1) if c.sr_bin_boundaries else None)
        layers += [Snake1d(n_out), CausalConv1d(n_out, 1, kernel_size=7, padding=3), nn.Tanh()]
        cond += [None] * 3
        self.model = nn.ModuleList(layers)
        if c.sr_bin_boundaries:
            self.register_buffer("sr_bin_boundaries", torch.tensor(c.sr_bin_boundaries, dtype=torch.int32))
            self.sr_cond_model = nn.ModuleList(m if m is not None else nn.Identity() for m in cond)
        else:
            self.sr_bin_boundaries = None
        self.out_sample_rate = c.out_sample_rate

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """[B, D, steps] -> [B, 1, steps * decode_hop_length] at `out_sample_rate`."""
        if self.sr_bin_boundaries is None:
            for layer in self.model:
                z = layer(z)
            return z
        rate = torch.tensor([self.out_sample_rate], device=z.device, dtype=torch.int32)
        bucket = torch.bucketize(rate, self.sr_bin_boundaries)
        for layer, condition in zip(self.model, self.sr_cond_model):
            if isinstance(condition, RateCondition):
                z = condition(z, bucket)
            z = layer(z)
        return z


class RateCondition(nn.Module):
    """Scale and shift a block's input by its output-rate bucket (cond_type "scale_bias")."""

    def __init__(self, dim: int, num_buckets: int) -> None:
        super().__init__()
        self.scale_embed = nn.Embedding(num_buckets, dim)
        self.bias_embed = nn.Embedding(num_buckets, dim)

    def forward(self, x: torch.Tensor, bucket: torch.Tensor) -> torch.Tensor:
        return x * self.scale_embed(bucket)[..., None] + self.bias_embed(bucket)[..., None]


def fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`weight_g` / `weight_v` pairs (torch's weight_norm, dim 0) -> plain `weight`s."""
    out = {}
    for name, tensor in state.items():
        if name.endswith(".weight_v"):
            g = state[name[:-1] + "g"]
            norm = tensor.flatten(1).norm(dim=1).view(-1, *([1] * (tensor.ndim - 1)))
            out[name[:-len("_v")]] = tensor * (g / norm)
        elif not name.endswith(".weight_g"):
            out[name] = tensor
    return out


def read_vae_state(folder: Path) -> dict[str, torch.Tensor]:
    """The VAE tensors: `audiovae.safetensors`, else `audiovae.pth` (its "state_dict" if it has one)."""
    if (folder / "audiovae.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(folder / "audiovae.safetensors")
    if (folder / "audiovae.pth").is_file():
        state = torch.load(folder / "audiovae.pth", map_location="cpu", weights_only=True)
        return state.get("state_dict", state)
    raise FileNotFoundError(f"{folder}: no audio VAE (audiovae.safetensors or audiovae.pth)")


def load_vae_part(folder: Path, config: AudioVAEConfig, part: str, device: torch.device) -> nn.Module:
    """The checkpoint's "encoder" or "decoder" in fp32 (small; the waveform is float), weights folded."""
    module = Encoder(config) if part == "encoder" else Decoder(config)
    prefix = part + "."
    state = {k[len(prefix):]: v for k, v in fold_weight_norm(read_vae_state(folder)).items() if k.startswith(prefix)}
    module.load_state_dict(state, strict=True)
    return module.to(device=device, dtype=torch.float32).eval()
