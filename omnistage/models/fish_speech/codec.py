"""Fish Speech's codec decoder (the authors' modded DAC in codec.pth): frames of codes -> 44.1 kHz
audio, streamed.

The decode path of the authors' `DAC.decode` (fish-speech 0.1.0, `models/dac`):

    quantizer   codebook 0 from the semantic codebook, the others from DAC's residual
                quantizer: each code's embedding projected by a weight-normed 1x1 conv, summed
    post_module a causal transformer (RMSNorm, rotary, layer scale, SwiGLU), attention
                limited to the last `WINDOW` positions, at the frame rate
    upsample    x2, x2: a causal transposed conv then a ConvNeXt block (causal depthwise conv)
    decoder     DAC's decoder with causal convs: a conv, blocks of Snake + causal transposed
                conv + three residual units (x8, x8, x4, x2), Snake, a conv and tanh

(The decoder's transformer layers are built but left out of its blocks by the authors, so
none run.) A stream keeps, per attention layer, the keys and values of its last `WINDOW - 1`
positions, and the transformer's output frames go through the convolutions with their left
context (`talker_codec.window.ContextWindow`, sized by the convolutions' receptive field): no
lookahead, and chunk after chunk equals the one-shot decode up to float rounding.

Sizes come from the weights; what the checkpoint does not hold is the released config's
(`modded_dac_vq.yaml`): 44.1 kHz, 64-wide attention heads, a window of 128, rotary base 10000.
Only the decoding tensors are read (the encoder, which cloning needs, is not served).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omnistage.generation.decoder import Decoder
from omnistage.models.fish_speech.modeling import apply_rotary, rms_norm
from omnistage.models.talker_codec.window import ContextWindow, receptive_frames

SAMPLE_RATE = 44100
HEAD_DIM = 64
WINDOW = 128
ROPE_BASE = 10000.0
NORM_EPS = 1e-5
RELEASED_FRAME_RATE = SAMPLE_RATE / 2048
"""Frames per second of the released codec (512 samples a latent, 4 latents a frame); the
talker's pacing (`audio_frame_rate`), read without loading codec.pth."""


def load_codec_weights(path: Path) -> dict[str, torch.Tensor]:
    """codec.pth's tensors, with weight norms folded and the training wrapper's prefix dropped."""
    weights = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    weights = weights.get("state_dict", weights)
    if any(k.startswith("generator.") for k in weights):
        weights = {k[len("generator."):]: v for k, v in weights.items() if k.startswith("generator.")}
    out = {}
    for name, value in weights.items():
        for g_name, v_name in ((".parametrizations.weight.original0", ".parametrizations.weight.original1"),
                               (".weight_g", ".weight_v")):
            if name.endswith(g_name):
                base = name[: -len(g_name)]
                v = weights[base + v_name].float()
                norm = v.flatten(1).norm(dim=1).view(-1, *[1] * (v.ndim - 1))
                out[base + ".weight"] = value.float() * v / norm
        if not name.endswith((".original0", ".original1", ".weight_g", ".weight_v")):
            out[name] = value
    return out


def rotary_at(positions: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[T, head_dim / 2, 2] (cos, sin) at `positions`, rounded to bf16 as the authors' table."""
    freqs = 1.0 / (ROPE_BASE ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    cis = torch.polar(torch.ones(len(positions), len(freqs)), torch.outer(positions.float(), freqs))
    return torch.stack([cis.real, cis.imag], dim=-1).to(torch.bfloat16)


class WindowTransformer(nn.Module):
    """The quantizer's post_module: causal attention over the last `WINDOW` positions."""

    def __init__(self, weights: dict[str, torch.Tensor], prefix: str) -> None:
        super().__init__()
        count = 1 + max(int(k[len(prefix) + 7:].split(".")[0]) for k in weights if k.startswith(prefix + "layers."))
        names = ("attention.wqkv.weight", "attention.wo.weight", "attention_norm.weight", "ffn_norm.weight",
                 "attention_layer_scale.gamma", "ffn_layer_scale.gamma", "feed_forward.w1.weight",
                 "feed_forward.w2.weight", "feed_forward.w3.weight")
        self.layers = [[nn.Parameter(weights[f"{prefix}layers.{i}.{n}"].float(), requires_grad=False) for n in names]
                       for i in range(count)]
        self.params = nn.ParameterList([p for layer in self.layers for p in layer])
        self.norm = nn.Parameter(weights[f"{prefix}norm.weight"].float(), requires_grad=False)
        self.heads = self.layers[0][1].shape[1] // HEAD_DIM

    def forward(self, x: torch.Tensor, cache: list, start: int) -> torch.Tensor:
        """x [1, T, C] at positions start.. -> [1, T, C]; `cache` holds each layer's last keys and values."""
        b, t, _ = x.shape
        positions = torch.arange(start, start + t)
        rotary = rotary_at(positions, HEAD_DIM).to(x.device)[None]
        for i, (wqkv, wo, attn_norm, ffn_norm, attn_scale, ffn_scale, w1, w2, w3) in enumerate(self.layers):
            q, k, v = F.linear(rms_norm(x, attn_norm, NORM_EPS), wqkv).view(b, t, 3, self.heads, HEAD_DIM).unbind(2)
            q, k = apply_rotary(q, rotary).transpose(1, 2), apply_rotary(k, rotary).transpose(1, 2)
            v = v.transpose(1, 2)
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], dim=2), torch.cat([cache[i][1], v], dim=2)
            key_positions = torch.arange(start + t - k.shape[2], start + t)
            delta = positions[:, None] - key_positions[None]
            mask = ((delta >= 0) & (delta < WINDOW)).to(x.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            cache[i] = (k[:, :, -(WINDOW - 1):], v[:, :, -(WINDOW - 1):])
            x = x + F.linear(out.transpose(1, 2).reshape(b, t, -1), wo) * attn_scale
            h = rms_norm(x, ffn_norm, NORM_EPS)
            x = x + F.linear(F.silu(F.linear(h, w1)) * F.linear(h, w3), w2) * ffn_scale
        return rms_norm(x, self.norm, NORM_EPS)


def _conv(weights: dict, prefix: str, transposed: bool = False, **kwargs) -> nn.Module:
    w = weights[prefix + ".weight"].float()
    channels_in, channels_out = (w.shape[0], w.shape[1]) if transposed else (w.shape[1] * kwargs.get("groups", 1),
                                                                             w.shape[0])
    conv = (nn.ConvTranspose1d if transposed else nn.Conv1d)(channels_in, channels_out, w.shape[-1], **kwargs)
    conv.weight.data, conv.bias.data = w, weights[prefix + ".bias"].float()
    return conv.requires_grad_(False)


class CausalConv(nn.Module):
    """The authors' CausalConvNet at stride 1: left-pads the kernel's span."""

    def __init__(self, weights: dict, prefix: str, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = _conv(weights, prefix, dilation=dilation, groups=groups)
        self.pad = (self.conv.kernel_size[0] - 1) * dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.pad, 0)))


class CausalTransposedConv(nn.Module):
    """The authors' CausalTransConvNet: the output's last `kernel - stride` samples cut."""

    def __init__(self, weights: dict, prefix: str, stride: int) -> None:
        super().__init__()
        self.conv = _conv(weights, prefix, transposed=True, stride=stride)
        self.cut = self.conv.kernel_size[0] - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.cut]


class Snake(nn.Module):
    def __init__(self, alpha: torch.Tensor) -> None:
        super().__init__()
        self.alpha = nn.Parameter(alpha.float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class ConvNeXt(nn.Module):
    def __init__(self, weights: dict, prefix: str) -> None:
        super().__init__()
        self.dwconv = CausalConv(weights, prefix + ".dwconv.conv", groups=weights[prefix + ".norm.weight"].shape[0])
        get = lambda n: nn.Parameter(weights[f"{prefix}.{n}"].float(), requires_grad=False)  # noqa: E731
        self.norm_w, self.norm_b, self.gamma = get("norm.weight"), get("norm.bias"), get("gamma")
        self.w1, self.b1, self.w2, self.b2 = (get(n) for n in ("pwconv1.weight", "pwconv1.bias", "pwconv2.weight",
                                                               "pwconv2.bias"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(self.dwconv(x).transpose(1, 2), self.norm_w.shape, self.norm_w, self.norm_b, 1e-6)
        h = F.linear(F.gelu(F.linear(h, self.w1, self.b1)), self.w2, self.b2)
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, weights: dict, prefix: str, dilation: int) -> None:
        super().__init__()
        self.block = nn.Sequential(Snake(weights[prefix + ".block.0.alpha"]),
                                   CausalConv(weights, prefix + ".block.1.conv", dilation=dilation),
                                   Snake(weights[prefix + ".block.2.alpha"]), CausalConv(weights, prefix + ".block.3.conv"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)  # causal: same length


class ConvStack(nn.Module):
    """The quantizer's upsampling and the DAC decoder: transformer output [1, C, frames] -> [1, 1, samples]."""

    def __init__(self, weights: dict) -> None:
        super().__init__()
        layers = []
        for i in range(sum(1 for k in weights if k.startswith("quantizer.upsample.") and k.endswith(".0.conv.bias"))):
            p = f"quantizer.upsample.{i}"
            w = weights[p + ".0.conv.weight"]
            layers += [CausalTransposedConv(weights, p + ".0.conv", stride=w.shape[-1]), ConvNeXt(weights, p + ".1")]
        layers.append(CausalConv(weights, "decoder.model.0.conv"))
        i = 1
        while f"decoder.model.{i}.block.0.alpha" in weights:
            p = f"decoder.model.{i}.block"
            stride = weights[p + ".1.conv.weight"].shape[-1] // 2
            layers += [Snake(weights[p + ".0.alpha"]), CausalTransposedConv(weights, p + ".1.conv", stride)]
            layers += [ResidualUnit(weights, f"{p}.{2 + j}", dilation) for j, dilation in enumerate((1, 3, 9))]
            i += 1
        layers += [Snake(weights[f"decoder.model.{i}.alpha"]), CausalConv(weights, f"decoder.model.{i + 1}.conv"),
                   nn.Tanh()]
        self.model = nn.Sequential(*layers)
        self.hop_length = int(np.prod([m.conv.stride[0] for m in layers if isinstance(m, CausalTransposedConv)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class FishCodecModel(nn.Module):
    def __init__(self, weights: dict) -> None:
        super().__init__()
        names = [f"{p}.{i}" for p in ("quantizer.semantic_quantizer.quantizers", "quantizer.quantizer.quantizers")
                 for i in range(sum(1 for k in weights if k.startswith(p + ".") and k.endswith(".codebook.weight")))]
        # Per codebook: its embeddings, then its weight-normed 1x1 projection (weight, bias).
        self.books = nn.ParameterList(nn.Parameter(weights[f"{name}.{t}"].float(), requires_grad=False)
                                      for name in names for t in ("codebook.weight", "out_proj.weight", "out_proj.bias"))
        self.codebook_sizes = [self.books[3 * i].shape[0] for i in range(len(names))]
        self.transformer = WindowTransformer(weights, "quantizer.post_module.")
        self.convs = ConvStack(weights)

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """[frames, codebooks] -> [1, frames, C], the quantizer's sum (its order)."""
        z = 0.0
        for i in range(len(self.codebook_sizes)):
            book, w, b = self.books[3 * i: 3 * i + 3]
            z = z + F.conv1d(F.embedding(codes[None, :, i], book).transpose(1, 2), w, b)
        return z.transpose(1, 2)


@dataclass
class _Stream:
    position: int = 0
    caches: list = field(default_factory=list)
    window: ContextWindow = field(default_factory=ContextWindow)


class FishCodec(Decoder):
    chunk_frames = None  # all pending frames of a stream in one pass

    def __init__(self, model: FishCodecModel, device: torch.device) -> None:
        self.model = model.to(device)
        self.device = device
        self.sample_rate = SAMPLE_RATE
        self.hop_length = model.convs.hop_length
        self.context = receptive_frames(model.convs, causal=True)

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype, max_streams: int) -> FishCodec:
        # fp32 whatever the stage dtype, as the other codecs: small, and the waveform is float.
        return cls(FishCodecModel(load_codec_weights(Path(model_path) / "codec.pth")), device)

    def parse(self, codes: Any) -> torch.Tensor:
        """[frames, codebooks] codes, each in its codebook's range."""
        sizes = self.model.codebook_sizes
        t = codes if torch.is_tensor(codes) else torch.as_tensor(codes)
        if t.numel() == 0:
            t = t.long().reshape(0, len(sizes))
        if t.dtype.is_floating_point or t.ndim != 2 or t.shape[1] != len(sizes):
            raise ValueError(f"Fish Speech codes must be integer [frames, {len(sizes)}], got {t.dtype} {tuple(t.shape)}")
        if t.numel() and bool(((t < 0) | (t >= torch.tensor(sizes, device=t.device))).any()):
            raise ValueError(f"Fish Speech codes must be in [0, {sizes[0]}) (codebook 0) and [0, {sizes[-1]}) "
                             "(the others)")
        return t.to(self.device, torch.long)

    def open_stream(self, options: dict | None = None) -> _Stream:
        return _Stream(caches=[None] * len(self.model.transformer.layers))

    @torch.inference_mode()
    def decode(self, codes: list[torch.Tensor], states: list[_Stream]) -> list[np.ndarray]:
        # Streams differ in position and length: one pass per row.
        return [self._voice(c, st) for c, st in zip(codes, states)]

    def _voice(self, codes: torch.Tensor, st: _Stream) -> np.ndarray:
        if codes.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        z = self.model.transformer(self.model.embed(codes), st.caches, st.position)
        st.position += codes.shape[0]
        return st.window.voice(self.model.convs, z[0].T, context=self.context, keep=0, hop_length=self.hop_length)

    def close(self) -> None:
        self.model = None
