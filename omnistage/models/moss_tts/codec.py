"""MOSS-TTS's codec stage: MOSS-Audio-Tokenizer's decoder, 32-codebook frames -> 24 kHz audio,
streamed.

The decoder dequantises each frame (32 residual codebooks, each projected by a weight-normed
1x1 convolution, summed, projected again), then runs four causal transformers, each followed
by a patch step that trades channels for time (x2, x2, x2, then x240: 1920 samples a frame).
Attention is causal with a window of `context` positions (the config's
`causal_transformer_context_duration` at each transformer's frame rate), so a stream keeps,
per attention layer, the keys and values of its last `context` positions and decodes every
frame as soon as it arrives: chunk after chunk equals the one-shot decode (up to float
rounding), with no lookahead. The authors' `moss_tts_lite.codec.MossCodecDecoder` does the
same; its stage sizes are constants of the released model, here they are read from the
config's `decoder_kwargs`.

A frame of padding codes (1024) between frames marks a new audio block: the stream restarts
there, as the authors decode each block on its own. The checkpoint is the folder
`MOSS-Audio-Tokenizer/` inside the model folder.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from omnistage.generation.decoder import Decoder

CODEC_FOLDER = "MOSS-Audio-Tokenizer"


def _weight_normed(weights: dict, prefix: str) -> torch.Tensor:
    """A 1x1 convolution's effective weight [out, in, 1] from torch's weight_norm parametrization."""
    g = weights[f"{prefix}.parametrizations.weight.original0"].float().reshape(-1, 1)
    v = weights[f"{prefix}.parametrizations.weight.original1"].float().squeeze(-1)
    return (g * v / v.norm(dim=1, keepdim=True)).unsqueeze(-1)


def _rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Interleaved-pair rotary embedding of x [B, H, T, D] at absolute `positions` [T]."""
    d = x.shape[-1]
    freqs = torch.exp(torch.arange(d // 2, dtype=torch.float32, device=x.device) * (-math.log(10000.0) * 2.0 / d))
    angles = freqs.view(1, -1) * positions.float().view(-1, 1)
    cos, sin = angles.cos().view(1, 1, -1, d // 2), angles.sin().view(1, 1, -1, d // 2)
    pairs = x.float().view(*x.shape[:-1], d // 2, 2)
    re, im = pairs[..., 0], pairs[..., 1]
    return torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1).view(x.shape)


class _Transformer:
    """One causal windowed transformer (LayerNorm, layer scale, GELU MLP), fp32."""

    def __init__(self, weights: dict, prefix: str, spec: dict, context: int, device: torch.device) -> None:
        get = lambda name: weights[name].float().to(device)  # noqa: E731
        self.heads, self.context = spec["num_heads"], context
        self.in_w = get(f"{prefix}.input_proj.weight") if f"{prefix}.input_proj.weight" in weights else None
        self.out_w = get(f"{prefix}.output_proj.weight") if f"{prefix}.output_proj.weight" in weights else None
        names = ("self_attn.in_projs.0.weight", "self_attn.out_projs.0.weight", "norm1.weight", "norm1.bias",
                 "norm2.weight", "norm2.bias", "linear1.weight", "linear2.weight", "layer_scale_1.scale",
                 "layer_scale_2.scale")
        self.layers = [[get(f"{prefix}.transformer.layers.{i}.{n}") for n in names] for i in range(spec["num_layers"])]

    def __call__(self, x: torch.Tensor, cache: list | None, start: int) -> torch.Tensor:
        """x [1, C, T] -> [1, C', T]; positions start at `start`; `cache` holds each layer's last keys/values."""
        h = x.transpose(1, 2)
        if self.in_w is not None:
            h = h @ self.in_w.t()
        b, t, c = h.shape
        dh = c // self.heads
        positions = start + torch.arange(t, device=h.device)
        for i, (qkv_w, o_w, n1w, n1b, n2w, n2b, f1, f2, ls1, ls2) in enumerate(self.layers):
            n = F.layer_norm(h, (c,), n1w, n1b, 1e-5)
            q, k, v = (n @ qkv_w.t()).view(b, t, 3, self.heads, dh).permute(2, 0, 3, 1, 4)
            q, k = _rope(q, positions), _rope(k, positions)
            past = cache[i] if cache is not None else None
            keys = k if past is None else torch.cat([past[0], k], dim=2)
            vals = v if past is None else torch.cat([past[1], v], dim=2)
            key_pos = start - (keys.shape[2] - t) + torch.arange(keys.shape[2], device=h.device)
            delta = positions.view(-1, 1) - key_pos.view(1, -1)
            mask = ((delta >= 0) & (delta < self.context)).view(1, 1, t, -1)
            o = F.scaled_dot_product_attention(q, keys, vals, mask)
            if cache is not None:
                cache[i] = (keys[:, :, -(self.context - 1):], vals[:, :, -(self.context - 1):])
            h = h + ls1 * (o.transpose(1, 2).reshape(b, t, c) @ o_w.t())
            n = F.layer_norm(h, (c,), n2w, n2b, 1e-5)
            h = h + ls2 * F.linear(F.gelu(n @ f1.t()), f2)
        if self.out_w is not None:
            h = h @ self.out_w.t()
        return h.transpose(1, 2)


@dataclass
class _Stream:
    position: int = 0
    """Frames decoded so far."""
    caches: list = field(default_factory=list)
    """Per transformer, per layer: the last `context - 1` keys and values (None before the first)."""


class MossCodec(Decoder):
    chunk_frames = None  # all pending frames of a stream in one pass

    def __init__(self, folder: Path, device: torch.device) -> None:
        from safetensors.torch import load_file

        config = json.loads((folder / "config.json").read_text())
        files = sorted(folder.glob("*.safetensors"))
        weights = {}
        for name in files:
            weights |= load_file(name)
        self.device = device
        self.sample_rate = config["sampling_rate"]
        nq = sum(1 for k in weights if k.startswith("quantizer.quantizers.") and k.endswith(".codebook.weight"))
        q = [f"quantizer.quantizers.{i}" for i in range(nq)]
        self.codebooks = [weights[f"{p}.codebook.weight"].float().to(device) for p in q]
        self.code_proj = [(_weight_normed(weights, f"{p}.out_proj").to(device),
                           weights[f"{p}.out_proj.bias"].float().to(device)) for p in q]
        self.out_proj = (_weight_normed(weights, "quantizer.output_proj").to(device),
                         weights["quantizer.output_proj.bias"].float().to(device))
        frame_rate = config["sampling_rate"] / config["downsample_rate"]
        seconds = float(config["causal_transformer_context_duration"])
        self.stages: list[tuple[_Transformer, int]] = []  # (transformer, patch size after it)
        specs = config["decoder_kwargs"]
        for index, spec in enumerate(specs):
            if spec["module_type"] != "Transformer":
                continue
            patch = specs[index + 1] if index + 1 < len(specs) else {}
            if patch.get("module_type") != "PatchedPretransform":
                raise ValueError(f"{folder}/config.json: decoder_kwargs[{index + 1}] should be the patch step after "
                                 f"transformer {index}, got {patch}")
            self.stages.append((_Transformer(weights, f"decoder.{index}", spec, int(frame_rate * seconds), device),
                                patch["patch_size"]))
            frame_rate *= patch["patch_size"]
        self.model = self.stages
        self.codebook_size = self.codebooks[0].shape[0]

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype, max_streams: int) -> MossCodec:
        # fp32 whatever the stage dtype, as the authors' decoder (exact-parity decode).
        return cls(Path(model_path) / CODEC_FOLDER, device)

    def parse(self, codes: Any) -> torch.Tensor:
        """[frames, 32] codes in the codebooks' range."""
        t = codes if torch.is_tensor(codes) else torch.as_tensor(codes)
        if t.numel() == 0:
            t = t.long().reshape(0, len(self.codebooks))
        if t.dtype.is_floating_point or t.ndim != 2 or t.shape[1] != len(self.codebooks):
            raise ValueError(f"MOSS-TTS codes must be integer [frames, {len(self.codebooks)}], "
                             f"got {t.dtype} {tuple(t.shape)}")
        pad = t == self.codebook_size
        if t.numel() and (int(t.min()) < 0 or int(t.max()) > self.codebook_size
                          or bool((pad.any(dim=1) & ~pad.all(dim=1)).any())):
            raise ValueError(f"MOSS-TTS codes must be in [0, {self.codebook_size}), or a frame all "
                             f"{self.codebook_size} (the padding code: a break between audio blocks)")
        return t.to(self.device, torch.long)

    def open_stream(self, options: dict | None = None) -> _Stream:
        return _Stream(caches=[[None] * len(t.layers) for t, _ in self.stages])

    @torch.inference_mode()
    def decode(self, codes: list[torch.Tensor], states: list[_Stream]) -> list[np.ndarray]:
        # Streams differ in position and length: one pass per row.
        return [self._voice(c, st) for c, st in zip(codes, states)]

    def _voice(self, codes: torch.Tensor, st: _Stream) -> np.ndarray:
        """Each all-padding frame restarts the stream (a new audio block, decoded on its own)."""
        pieces, start = [], 0
        for brk in (codes == self.codebook_size).all(dim=1).nonzero().view(-1).tolist() + [codes.shape[0]]:
            if brk > start:
                pieces.append(self._voice_block(codes[start:brk], st))
            if brk < codes.shape[0]:
                st.position, st.caches = 0, [[None] * len(t.layers) for t, _ in self.stages]
            start = brk + 1
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)

    def _voice_block(self, codes: torch.Tensor, st: _Stream) -> np.ndarray:
        emb = 0
        for i, (book, (w, b)) in enumerate(zip(self.codebooks, self.code_proj)):
            emb = emb + F.conv1d(F.embedding(codes[:, i][None], book).transpose(1, 2), w, b)
        x = F.conv1d(emb, *self.out_proj)
        position, t = st.position, codes.shape[0]
        for (transformer, patch), cache in zip(self.stages, st.caches):
            x = transformer(x, cache, position)
            b, c, length = x.shape  # patch step: [B, C * p, T] -> [B, C, T * p]
            x = x.reshape(b, c // patch, patch, length).permute(0, 1, 3, 2).reshape(b, c // patch, length * patch)
            position *= patch
        st.position += t
        return x[0, 0].cpu().numpy()

    def close(self) -> None:
        self.model = self.stages = self.codebooks = None
