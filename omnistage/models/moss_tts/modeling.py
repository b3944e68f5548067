"""MOSS-TTS's backbone: a Qwen3 decoder over 33 summed input streams (text + 32 codebooks),
with a text head and 32 codebook heads.

The checkpoint's names (`language_model.*`, `emb_ext.{i}`, `lm_heads.{0..32}`) are the
authors' (`moss_tts_lite.model.MossTTSModel` reads the same file); sizes come from the
weights, as theirs. Layers write the AR engine's paged KV cache. Float order follows the
authors' (fp32 statistics in the norms, rope tables cast to the weights' dtype) so fp32 runs
agree with theirs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

N_VQ = 32
AUDIO_PAD_CODE = 1024
"""The codebook heads' and inputs' padding code (never sampled)."""
ROPE_THETA, RMS_EPS = 1_000_000.0, 1e-6
"""The authors' constants (Qwen3-8B's)."""
_PARTS = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
          "o_proj": "self_attn.o_proj", "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
          "input_layernorm": "input_layernorm", "post_attention_layernorm": "post_attention_layernorm",
          "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj"}


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    v = x.float().pow(2).mean(-1, keepdim=True)
    return weight * (x.float() * torch.rsqrt(v + RMS_EPS)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class MossTTSBackbone(nn.Module):
    def __init__(self, weights: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        super().__init__()
        ids = sorted({int(k.split(".")[2]) for k in weights if k.startswith("language_model.layers.")})
        if ids != list(range(len(ids))) or not ids:
            raise ValueError(f"MOSS-TTS checkpoint: unexpected layer ids {ids[:8]}")
        p = lambda name: nn.Parameter(weights[name].to(dtype), requires_grad=False)  # noqa: E731
        self.embed_tokens = p("language_model.embed_tokens.weight")
        self.norm = p("language_model.norm.weight")
        self.emb_ext = nn.ParameterList(p(f"emb_ext.{i}.weight") for i in range(N_VQ))
        self.text_head = p("lm_heads.0.weight")
        self.audio_heads = nn.ParameterList(p(f"lm_heads.{i + 1}.weight") for i in range(N_VQ))
        self.layers = nn.ModuleList()
        for i in ids:
            layer = nn.Module()
            for attr, suffix in _PARTS.items():
                layer.register_parameter(attr, p(f"language_model.layers.{i}.{suffix}.weight"))
            self.layers.append(layer)
        self.hidden_size = self.embed_tokens.shape[1]
        self.head_dim = self.layers[0].q_norm.shape[0]
        self.num_heads = self.layers[0].q_proj.shape[0] // self.head_dim
        self.num_kv_heads = self.layers[0].k_proj.shape[0] // self.head_dim
        self.text_vocab = self.embed_tokens.shape[0]
        inv = 1.0 / (ROPE_THETA ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def embed(self, text: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        """text [B, T], audio [B, T, 32] -> the 33 embeddings summed in the authors' order."""
        h = F.embedding(text, self.embed_tokens)
        for i in range(N_VQ):
            h = h + F.embedding(audio[..., i], self.emb_ext[i])
        return h

    def forward(self, h: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor | None) -> torch.Tensor:
        """[B, T, H] embeddings -> the final-normed hidden states."""
        angles = positions.float()[..., None] * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(h.dtype)[:, None], angles.sin().to(h.dtype)[:, None]
        b, t, _ = h.shape
        for index, L in enumerate(self.layers):
            x = rms_norm(h, L.input_layernorm)
            q, k, v = (F.linear(x, w).view(b, t, n, self.head_dim).transpose(1, 2) for w, n in
                       ((L.q_proj, self.num_heads), (L.k_proj, self.num_kv_heads), (L.v_proj, self.num_kv_heads)))
            q, k = rms_norm(q, L.q_norm), rms_norm(k, L.k_norm)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            k, v = cache.update(k, v, index)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and t > 1,
                                                 enable_gqa=True)
            h = h + F.linear(out.transpose(1, 2).reshape(b, t, -1), L.o_proj)
            x = rms_norm(h, L.post_attention_layernorm)
            h = h + F.linear(F.silu(F.linear(x, L.gate_proj)) * F.linear(x, L.up_proj), L.down_proj)
        return rms_norm(h, self.norm)

    def audio_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, H] -> [B, 32, 1025], the padding code at -inf (32 GEMMs, as the authors')."""
        out = torch.stack([F.linear(hidden, w) for w in self.audio_heads], dim=1)
        out[..., AUDIO_PAD_CODE] = float("-inf")
        return out
