"""VoxCPM2's generation model (everything in `model.safetensors`), with the authors' parameter names.

    base_lm        MiniCPM-4 text-semantic LM over text tokens and audio patches
    residual_lm    MiniCPM-4 acoustic LM (no embedding table) over the base LM's quantized states
    feat_encoder   local encoder: one latent patch [P, D] -> one LM input (its CLS token)
    feat_decoder   local DiT: (base, residual) states + the previous patch -> the next patch,
                   by `n_steps` Euler steps of a flow with classifier-free guidance (CFG-zero*)
    fsq_layer      scalar quantization of the base LM's audio-position states
    stop_head      continue / stop, from the base LM state

The two LMs write the AR engine's paged KV cache (base layers first, then the residual's);
the local encoder and DiT attend within one patch and keep no cache. Shapes and constants
come from the checkpoint's `config.json` (`VoxCPMConfig` in the authors' package).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LMConfig:
    """A MiniCPM-4 stack: `lm_config`, or its copy resized for the encoder / DiT / residual LM."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: dict
    vocab_size: int = 0
    use_mup: bool = True
    scale_emb: float = 1.0
    scale_depth: float = 1.0
    kv_channels: int | None = None
    no_rope: bool = False

    @classmethod
    def from_dict(cls, d: dict) -> LMConfig:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    def resized(self, part: dict) -> LMConfig:
        """The encoder's / DiT's stack: `lm_config` with the part's sizes and no vocabulary."""
        return replace(self, hidden_size=part["hidden_dim"], intermediate_size=part["ffn_dim"],
                       num_attention_heads=part["num_heads"], num_hidden_layers=part["num_layers"],
                       kv_channels=part.get("kv_channels"), vocab_size=0)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.float().pow(2).mean(dim=-1, keepdim=True)
    return (x * torch.rsqrt(variance + eps)).to(x.dtype) * weight


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class LongRoPE(nn.Module):
    """MiniCPM's LongRoPE: the factor list (long when the table exceeds the original length) divides
    the positions, and cos/sin are scaled by sqrt(1 + log(scale) / log(original length))."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        scaling = config.rope_scaling
        original = scaling["original_max_position_embeddings"]
        length = config.max_position_embeddings
        factor = math.sqrt(1 + math.log(length / original) / math.log(original))
        dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2).float() / dim))
        ext = torch.tensor(scaling["long_factor"] if length > original else scaling["short_factor"],
                           dtype=torch.float32)
        freqs = torch.outer(torch.arange(length, dtype=torch.float32), 1.0 / ext) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos() * factor, persistent=False)
        self.register_buffer("sin", emb.sin() * factor, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions], self.sin[positions]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """q, k [B, H, T, D]; cos, sin [B, T, D] or [T, D]; in fp32, as the authors'."""
    if cos.ndim == 3:
        cos, sin = cos[:, None], sin[:, None]
    dtype = q.dtype
    q, k = q.float(), k.float()
    return (q * cos + _rotate_half(q) * sin).to(dtype), (k * cos + _rotate_half(k) * sin).to(dtype)


class Attention(nn.Module):
    def __init__(self, config: LMConfig, cache_layer: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (config.num_attention_heads, config.num_key_value_heads,
                                                            config.head_dim)
        self.cache_layer = cache_layer
        """This layer's index in the AR engine's KV cache."""
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)

    def forward(self, x: torch.Tensor, rope, cache, mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, k, *rope)
        if cache is not None:
            k, v = cache.update(k, v, self.cache_layer)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal and mask is None and t > 1,
                                             enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LMConfig, cache_layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, cache_layer)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # muP: each branch is scaled by scale_depth / sqrt(layers) before the residual add.
        self.branch_scale = config.scale_depth / math.sqrt(config.num_hidden_layers) if config.use_mup else 1.0

    def forward(self, x, rope, cache, mask, is_causal):
        x = x + self.self_attn(self.input_layernorm(x), rope, cache, mask, is_causal) * self.branch_scale
        return x + self.mlp(self.post_attention_layernorm(x)) * self.branch_scale


class MiniCPM(nn.Module):
    """A MiniCPM-4 stack; with `cache`, layer i writes the engine's cache layer `first_cache_layer + i`."""

    def __init__(self, config: LMConfig, first_cache_layer: int = 0) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size) if config.vocab_size else None
        self.layers = nn.ModuleList(DecoderLayer(config, first_cache_layer + i)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rope = None if config.no_rope else LongRoPE(config)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor | None = None, cache=None,
                mask: torch.Tensor | None = None, is_causal: bool = True) -> torch.Tensor:
        if positions is None:
            positions = torch.arange(embeds.shape[1], device=embeds.device)
        rope = None if self.rope is None else self.rope(positions)
        for layer in self.layers:
            embeds = layer(embeds, rope, cache, mask, is_causal)
        return self.norm(embeds)


class LocalEncoder(nn.Module):
    """A patch [P, D] -> one vector: its CLS token after a bidirectional MiniCPM over [CLS, patch]."""

    def __init__(self, config: LMConfig, feat_dim: int) -> None:
        super().__init__()
        self.special_token = nn.Parameter(torch.zeros(1, 1, 1, config.hidden_size))
        self.in_proj = nn.Linear(feat_dim, config.hidden_size)
        self.encoder = MiniCPM(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, P, D] -> [B, T, H]."""
        b, t, p, _ = x.shape
        x = self.in_proj(x)
        x = torch.cat([self.special_token.expand(b, t, 1, -1), x], dim=2).reshape(b * t, p + 1, -1)
        return self.encoder(x, is_causal=False)[:, 0].reshape(b, t, -1)


def timestep_embedding(t: torch.Tensor, dim: int, scale: float = 1000) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=t.dtype, device=t.device) * -(math.log(10000) / (half - 1)))
    emb = scale * t[:, None] * freqs[None]
    return torch.cat((emb.sin(), emb.cos()), dim=-1)


class TimestepMLP(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(size, size)
        self.linear_2 = nn.Linear(size, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class LocalDiT(nn.Module):
    """The velocity of a patch: a bidirectional MiniCPM over [mu (2 tokens), t, previous patch, x]."""

    def __init__(self, config: LMConfig, feat_dim: int) -> None:
        super().__init__()
        h = config.hidden_size
        self.hidden_size = h
        self.in_proj = nn.Linear(feat_dim, h)
        self.cond_proj = nn.Linear(feat_dim, h)
        self.out_proj = nn.Linear(h, feat_dim)
        self.time_mlp = TimestepMLP(h)
        self.delta_time_mlp = TimestepMLP(h)
        self.decoder = MiniCPM(config)

    def forward(self, x, mu, t, cond, dt):
        """x, cond [N, D, P]; mu [N, k * H]; t, dt [N] -> [N, D, P]."""
        x = self.in_proj(x.transpose(1, 2))
        cond = self.cond_proj(cond.transpose(1, 2))
        time = self.time_mlp(timestep_embedding(t, self.hidden_size).to(x.dtype))
        time = time + self.delta_time_mlp(timestep_embedding(dt, self.hidden_size).to(x.dtype))
        mu = mu.view(x.shape[0], -1, x.shape[-1])
        hidden = self.decoder(torch.cat([mu, time[:, None], cond, x], dim=1), is_causal=False)
        return self.out_proj(hidden[:, cond.shape[1] + mu.shape[1] + 1:]).transpose(1, 2)


class LocalCFM(nn.Module):
    """The authors' `UnifiedCFM` at inference: Euler steps from noise (t = 1) to the patch (t = 0)
    on a sway-sampled schedule, with CFG-zero* (the first 4% of steps skipped, the unconditional
    branch scaled by its optimal projection)."""

    def __init__(self, estimator: LocalDiT) -> None:
        super().__init__()
        self.estimator = estimator

    def forward(self, noise: torch.Tensor, mu: torch.Tensor, cond: torch.Tensor, n_steps: int,
                cfg_value: float) -> torch.Tensor:
        x = noise
        t_span = torch.linspace(1, 0, n_steps + 1, device=mu.device, dtype=mu.dtype)
        t_span = t_span + (torch.cos(torch.pi / 2 * t_span) - 1 + t_span)  # sway sampling, coefficient 1
        t, dt = t_span[0], t_span[0] - t_span[1]
        b = x.shape[0]
        zero_init_steps = max(1, int(len(t_span) * 0.04))
        for step in range(1, len(t_span)):
            if step <= zero_init_steps:
                velocity = torch.zeros_like(x)
            else:
                # Conditional and unconditional (mu = 0) branches in one batch.
                out = self.estimator(torch.cat([x, x]), torch.cat([mu, torch.zeros_like(mu)]),
                                     t.expand(2 * b), torch.cat([cond, cond]), torch.zeros(2 * b, dtype=x.dtype,
                                                                                           device=x.device))
                pos, neg = out[:b], out[b:]
                st = (pos.reshape(b, -1) * neg.reshape(b, -1)).sum(1, keepdim=True) / (
                    neg.reshape(b, -1).pow(2).sum(1, keepdim=True) + 1e-8)
                st = st.view(b, 1, 1)
                velocity = neg * st + cfg_value * (pos - neg * st)
            x = x - dt * velocity
            t = t - dt
            if step < len(t_span) - 1:
                dt = t - t_span[step + 1]
        return x


class ScalarQuantization(nn.Module):
    def __init__(self, size: int, latent_dim: int, scale: int) -> None:
        super().__init__()
        self.scale = scale
        self.in_proj = nn.Linear(size, latent_dim)
        self.out_proj = nn.Linear(latent_dim, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.round(torch.tanh(self.in_proj(x)) * self.scale) / self.scale)


class VoxCPM2(nn.Module):
    """The modules of `VoxCPM2Model` that `model.safetensors` holds (the audio VAE is audio_vae.py)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        lm = LMConfig.from_dict(config["lm_config"])
        self.lm_config = lm
        self.patch_size, self.feat_dim = config.get("patch_size", 4), config.get("feat_dim", 64)
        residual = replace(lm, num_hidden_layers=config.get("residual_lm_num_layers", 8), vocab_size=0,
                           no_rope=config.get("residual_lm_no_rope", False))
        self.base_lm = MiniCPM(lm)
        self.residual_lm = MiniCPM(residual, first_cache_layer=lm.num_hidden_layers)
        self.feat_encoder = LocalEncoder(lm.resized(config["encoder_config"]), self.feat_dim)
        dit = config["dit_config"]
        if dit.get("dit_mean_mode"):
            raise ValueError("VoxCPM2: dit_mean_mode checkpoints are not supported")
        self.feat_decoder = LocalCFM(LocalDiT(lm.resized(dit), self.feat_dim))
        h, h_enc, h_dit = lm.hidden_size, config["encoder_config"]["hidden_dim"], dit["hidden_dim"]
        self.fsq_layer = ScalarQuantization(h, config.get("scalar_quantization_latent_dim", 512),
                                            config.get("scalar_quantization_scale", 9))
        self.enc_to_lm_proj = nn.Linear(h_enc, h)
        self.lm_to_dit_proj = nn.Linear(h, h_dit)
        self.res_to_dit_proj = nn.Linear(h, h_dit)
        self.fusion_concat_proj = nn.Linear(2 * h, h)
        self.stop_proj = nn.Linear(h, h)
        self.stop_head = nn.Linear(h, 2, bias=False)

    @property
    def num_cache_layers(self) -> int:
        return len(self.base_lm.layers) + len(self.residual_lm.layers)

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        scale = self.lm_config.scale_emb if self.lm_config.use_mup else 1.0
        return self.base_lm.embed_tokens(ids) * scale

    def embed_patches(self, patches: torch.Tensor) -> torch.Tensor:
        """[B, T, P, D] latent patches -> [B, T, H] LM inputs."""
        return self.enc_to_lm_proj(self.feat_encoder(patches))

    def stop_logits(self, lm_hidden: torch.Tensor) -> torch.Tensor:
        return self.stop_head(F.silu(self.stop_proj(lm_hidden)))

    def next_patch(self, lm_hidden, residual_hidden, prev_patch, noise, n_steps: int, cfg_value: float):
        """[B, H] x 2, the previous patch [B, P, D], noise [B, D, P] -> the next patch [B, P, D]."""
        mu = torch.cat([self.lm_to_dit_proj(lm_hidden), self.res_to_dit_proj(residual_hidden)], dim=-1)
        return self.feat_decoder(noise, mu, prev_patch.transpose(1, 2), n_steps, cfg_value).transpose(1, 2)
