"""Fish Speech's dual-AR transformer (the authors' `DualARTransformer`, fish-speech 0.1.0):
a slow transformer over text and semantic tokens, then a fast one across a frame's codebooks.

    slow  token embedding + the frame's codebook embeddings summed (semantic rows only), a
          Llama/Qwen3 decoder (fused qkv, optional q/k norms, GQA) writing the AR engine's paged
          KV cache, tied (or separate) token logits; its last pre-norm hidden state feeds:
    fast  a few decoder layers over at most `num_codebooks` positions: position 0 reads the slow
          hidden state, position c reads codebook c - 1's code; their logits give codebook c.

Names and sizes are the checkpoint's (`model.pth` and `config.json`, which the authors'
`BaseModelArgs.from_pretrained` reads). Float order follows theirs: rotary tables rounded to
bf16, fp32 norm statistics, and the fast layers' explicit attention over a zeroed cache of
`num_codebooks` slots, so fp32 runs agree with theirs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DualARConfig:
    """The fields of the checkpoint's config.json ("model_type": "dual_ar") the model reads."""
    vocab_size: int
    n_layer: int
    n_head: int
    dim: int
    head_dim: int
    n_local_heads: int
    codebook_size: int
    num_codebooks: int
    n_fast_layer: int
    fast_dim: int
    fast_n_head: int
    fast_head_dim: int
    fast_n_local_heads: int
    rope_base: float
    norm_eps: float
    max_seq_len: int
    tie_word_embeddings: bool
    scale_codebook_embeddings: bool

    @classmethod
    def from_json(cls, data: dict) -> DualARConfig:
        if data.get("model_type") != "dual_ar":
            raise ValueError(f"Fish Speech checkpoint: config.json model_type {data.get('model_type')!r}, "
                             "expected 'dual_ar'")
        n_head = data.get("n_head", 32)
        head_dim = data.get("head_dim") or data["dim"] // n_head
        n_local = data.get("n_local_heads", -1)
        n_local = n_head if n_local in (-1, None) else n_local
        fast_n_head = data.get("fast_n_head") or n_head
        return cls(vocab_size=data["vocab_size"], n_layer=data["n_layer"], n_head=n_head, dim=data["dim"],
                   head_dim=head_dim, n_local_heads=n_local, codebook_size=data.get("codebook_size", 160),
                   num_codebooks=data.get("num_codebooks", 4), n_fast_layer=data.get("n_fast_layer", 4),
                   fast_dim=data.get("fast_dim") or data["dim"], fast_n_head=fast_n_head,
                   fast_head_dim=data.get("fast_head_dim") or head_dim,
                   fast_n_local_heads=data.get("fast_n_local_heads") or n_local,
                   rope_base=data.get("rope_base", 10000), norm_eps=data.get("norm_eps", 1e-5),
                   max_seq_len=data.get("max_seq_len", 2048),
                   tie_word_embeddings=data.get("tie_word_embeddings", True),
                   scale_codebook_embeddings=data.get("scale_codebook_embeddings", False))


def rotary_table(num_positions: int, head_dim: int, base: float) -> torch.Tensor:
    """[positions, head_dim / 2, 2] (cos, sin), rounded to bf16 as the authors' `precompute_freqs_cis`."""
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(num_positions), freqs)
    cis = torch.polar(torch.ones_like(angles), angles)
    return torch.stack([cis.real, cis.imag], dim=-1).to(torch.bfloat16)


def apply_rotary(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D], table [B, T, D / 2, 2]: interleaved (GPT-J) pairs rotated, in fp32."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    t = table[:, :, None]
    out = torch.stack([pairs[..., 0] * t[..., 0] - pairs[..., 1] * t[..., 1],
                       pairs[..., 1] * t[..., 0] + pairs[..., 0] * t[..., 1]], -1)
    return out.flatten(3).type_as(x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    normed = x.float() * torch.rsqrt(torch.mean(x.float() * x.float(), dim=-1, keepdim=True) + eps)
    return normed.type_as(x) * weight


class Block(nn.Module):
    """One decoder layer, the checkpoint's names (`attention.wqkv`, `feed_forward.w1`...)."""

    def __init__(self, weights: dict[str, torch.Tensor], prefix: str, heads: int, kv_heads: int, head_dim: int,
                 eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        get = lambda name: weights.get(prefix + name)  # noqa: E731
        p = lambda t: None if t is None else nn.Parameter(t.to(dtype), requires_grad=False)  # noqa: E731
        self.wqkv, self.wqkv_bias = p(get("attention.wqkv.weight")), p(get("attention.wqkv.bias"))
        self.wo, self.wo_bias = p(get("attention.wo.weight")), p(get("attention.wo.bias"))
        self.q_norm, self.k_norm = p(get("attention.q_norm.weight")), p(get("attention.k_norm.weight"))
        self.w1, self.w2, self.w3 = (p(get(f"feed_forward.{w}.weight")) for w in ("w1", "w2", "w3"))
        self.attention_norm, self.ffn_norm = p(get("attention_norm.weight")), p(get("ffn_norm.weight"))
        self.heads, self.kv_heads, self.head_dim, self.eps = heads, kv_heads, head_dim, eps

    def qkv(self, x: torch.Tensor, rotary: torch.Tensor):
        """Normed input [B, T, dim] -> q, k, v as [B, heads, T, D] (rotated)."""
        b, t, _ = x.shape
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = F.linear(x, self.wqkv, self.wqkv_bias).split([q_size, kv_size, kv_size], dim=-1)
        q, k = q.view(b, t, self.heads, self.head_dim), k.view(b, t, self.kv_heads, self.head_dim)
        v = v.view(b, t, self.kv_heads, self.head_dim)
        if self.q_norm is not None:  # torch's nn.RMSNorm, as the authors'
            q = F.rms_norm(q, (self.head_dim,), self.q_norm, self.eps)
            k = F.rms_norm(k, (self.head_dim,), self.k_norm, self.eps)
        q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def finish(self, h: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Residual adds around the attention output [B, heads, T, D] and the SwiGLU."""
        b, _, t, _ = attended.shape
        h = h + F.linear(attended.transpose(1, 2).reshape(b, t, -1), self.wo, self.wo_bias)
        x = rms_norm(h, self.ffn_norm, self.eps)
        return h + F.linear(F.silu(F.linear(x, self.w1)) * F.linear(x, self.w3), self.w2)


class DualAR(nn.Module):
    def __init__(self, config: DualARConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        super().__init__()
        c = self.config = config
        p = lambda name: nn.Parameter(weights[name].to(dtype), requires_grad=False)  # noqa: E731
        self.embeddings, self.codebook_embeddings = p("embeddings.weight"), p("codebook_embeddings.weight")
        self.norm = p("norm.weight")
        self.output = self.embeddings if c.tie_word_embeddings else p("output.weight")
        self.layers = nn.ModuleList(Block(weights, f"layers.{i}.", c.n_head, c.n_local_heads, c.head_dim,
                                          c.norm_eps, dtype) for i in range(c.n_layer))
        projects = "fast_project_in.weight" in weights
        self.fast_project_in = p("fast_project_in.weight") if projects else None
        self.fast_project_in_bias = p("fast_project_in.bias") if projects else None
        self.fast_embeddings, self.fast_norm, self.fast_output = (
            p(f"fast_{n}.weight") for n in ("embeddings", "norm", "output"))
        self.fast_layers = nn.ModuleList(Block(weights, f"fast_layers.{i}.", c.fast_n_head, c.fast_n_local_heads,
                                               c.fast_head_dim, c.norm_eps, dtype) for i in range(c.n_fast_layer))
        self.register_buffer("rotary", rotary_table(c.max_seq_len, c.head_dim, c.rope_base), persistent=False)
        self.register_buffer("fast_rotary", rotary_table(c.num_codebooks, c.fast_head_dim, c.rope_base),
                             persistent=False)

    # --- slow ------------------------------------------------------------------------------------

    def embed(self, tokens: torch.Tensor, codes: torch.Tensor, semantic: tuple[int, int]) -> torch.Tensor:
        """tokens [B, T], codes [B, T, num_codebooks] -> [B, T, dim]: codebook embeddings count on
        semantic tokens only (scaled by 1/sqrt(codebooks + 1) where the checkpoint says so)."""
        c = self.config
        vq = torch.stack([F.embedding(codes[..., i] + i * c.codebook_size, self.codebook_embeddings)
                          for i in range(c.num_codebooks)], dim=1).sum(dim=1)  # the authors' summation order
        is_semantic = (tokens >= semantic[0]) & (tokens <= semantic[1])
        vq[~is_semantic] = 0
        x = F.embedding(tokens, self.embeddings) + vq
        if c.scale_codebook_embeddings:
            x = torch.where(is_semantic[..., None], x / math.sqrt(c.num_codebooks + 1), x)
        return x

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor | None) -> torch.Tensor:
        """[B, T, dim] embeddings -> the last layer's hidden states, before the final norm."""
        rotary = self.rotary[positions]
        t = x.shape[1]
        for index, layer in enumerate(self.layers):
            q, k, v = layer.qkv(rms_norm(x, layer.attention_norm, layer.eps), rotary)
            k, v = cache.update(k, v, index)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and t > 1,
                                                 enable_gqa=True)
            x = layer.finish(x, out)
        return x

    def token_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm(hidden, self.norm, self.config.norm_eps), self.output)

    # --- fast ------------------------------------------------------------------------------------

    def fast_start(self, hidden: torch.Tensor) -> FastState:
        """A frame's fast pass for [B, dim] slow hidden states: position 0 read (its logits unused)."""
        c = self.config
        b = hidden.shape[0]
        x = hidden if self.fast_project_in is None else F.linear(hidden, self.fast_project_in,
                                                                 self.fast_project_in_bias)
        shape = (b, c.fast_n_local_heads, c.num_codebooks, c.fast_head_dim)
        state = FastState([torch.zeros(shape, dtype=x.dtype, device=x.device) for _ in self.fast_layers],
                          [torch.zeros(shape, dtype=x.dtype, device=x.device) for _ in self.fast_layers])
        self.fast_step(state, x)
        return state

    def fast_step(self, state: FastState, x: torch.Tensor) -> torch.Tensor:
        """Feed [B, fast_dim] at the next position -> [B, codebook_size] logits."""
        c, pos = self.config, state.position
        h = x[:, None]
        rotary = self.fast_rotary[pos].expand(h.shape[0], 1, *self.fast_rotary.shape[1:])
        # The authors' explicit attention over every slot, the unwritten ones (zeros) masked.
        bias = torch.zeros(1, 1, 1, c.num_codebooks, dtype=h.dtype, device=h.device)
        bias[..., pos + 1:] = float("-inf")
        for i, layer in enumerate(self.fast_layers):
            q, k, v = layer.qkv(rms_norm(h, layer.attention_norm, layer.eps), rotary)
            state.keys[i][:, :, pos] = k[:, :, 0]
            state.values[i][:, :, pos] = v[:, :, 0]
            groups = layer.heads // layer.kv_heads
            keys = state.keys[i].repeat_interleave(groups, dim=1)
            values = state.values[i].repeat_interleave(groups, dim=1)
            weight = q @ keys.transpose(-2, -1) * (1 / math.sqrt(q.size(-1))) + bias
            h = layer.finish(h, torch.softmax(weight, dim=-1) @ values)
        state.position += 1
        return F.linear(rms_norm(h, self.fast_norm, c.norm_eps), self.fast_output)[:, 0]


@dataclass
class FastState:
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    position: int = 0
