"""The token2wav DiT's velocity field over one window, with its step-invariant inputs computed once.

`Qwen2_5OmniToken2WavDiTModel.sample` calls the DiT's `forward` at every ODE evaluation
(Runge-Kutta 4: 4 per interval, 36 for the reference's 10 time points), and each call
recomputes what depends only on the window and the voice, not on the time or the noisy
mel: the speaker encoder (an ECAPA-TDNN over the voice's reference mel, with its zeroed
guidance twin), the code embeddings, the rotary tables and the block masks; and what
depends only on the time: the time embedding and every layer's AdaLN modulation (shift,
scale, gate), which are the same for every window, since every window runs the same ODE
time points. On a small DiT these are most of an evaluation's ops, and an evaluation is
bound by per-op overhead, so they are most of the first audio chunk's cost.

`DiTVelocity` runs the same arithmetic on the same tensors, so it gives the reference
forward's numbers exactly (`tests/models/test_qwen2_5_omni_token2wav.py` checks it against
`forward`, bit for bit), but computes the window's parts once per window, the time's parts
once per time point (`TimeCache`, kept across windows and requests) and the speaker encoder
once per voice and guidance mode (`SpeakerCache`). The layers' forward is restated around
the model's own modules (their linears, norms and activation), with two exact shortcuts:
SDPA gets its block mask already in the additive form it converts a boolean mask to, and the
first head's rotary embedding reads its interleaved dims by one index per term instead of
deinterleaving and rotating halves (a permutation and a sign move: the same products and sums).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GUIDANCE_OFF = 1e-5
"""Below this guidance scale the reference runs one unguided pass (`sample`'s threshold)."""
TIME_CACHE_ENTRIES = 4096
"""Time points whose embeddings are kept (10 ODE points make 28 distinct evaluation times)."""


class SpeakerCache:
    """The speaker encoder's output per (voice, guided): it reads only the voice's reference mel."""

    def __init__(self, dit) -> None:
        self.dit = dit
        self._encoded: dict[tuple[str, bool], torch.Tensor] = {}

    def encoded(self, voice: str, ref_mel: torch.Tensor, guided: bool) -> torch.Tensor:
        """[2 if guided else 1, enc_dim]: as `DiTInputEmbedding.forward` computes it (the guided batch
        is the voice's mel and its zeros, one pass, as there)."""
        key = (voice, guided)
        if key not in self._encoded:
            mel = torch.cat([ref_mel, torch.zeros_like(ref_mel)], dim=0) if guided else ref_mel
            self._encoded[key] = self.dit.input_embed.spk_encoder(mel)
        return self._encoded[key]


class TimeModulation:
    """Everything of one evaluation that depends only on its time: per layer the AdaLN terms
    as the layer applies them, and the final norm's."""

    def __init__(self, dit, t: torch.Tensor, batch: int) -> None:
        time_embedding = dit.time_embed(t.repeat(batch))
        self.layers = []
        for block in dit.transformer_blocks:
            norm = block.attn_norm
            shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = torch.chunk(
                norm.linear(norm.silu(time_embedding)), 6, dim=1)
            self.layers.append((1 + scale_msa[:, None], shift_msa[:, None], gate_msa.unsqueeze(1),
                                1 + scale_mlp[:, None], shift_mlp[:, None], gate_mlp.unsqueeze(1)))
        final = dit.norm_out
        scale, shift = torch.chunk(final.linear(final.silu(time_embedding)), 2, dim=1)
        self.final = ((1 + scale)[:, None, :], shift[:, None, :])


class TimeCache:
    """`TimeModulation` per (time, batch): every window of every request runs the same ODE times."""

    def __init__(self, dit) -> None:
        self.dit = dit
        self._entries: dict[tuple[float, int, torch.dtype], TimeModulation] = {}

    def get(self, t: torch.Tensor, batch: int) -> TimeModulation:
        key = (float(t), batch, t.dtype)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= TIME_CACHE_ENTRIES:
                self._entries.clear()  # odd schedules only: the default's 28 times never get here
            entry = self._entries[key] = TimeModulation(self.dit, t, batch)
        return entry


class DiTVelocity:
    """v(t, x) of `dit` over one window: what `sample`'s ODE function returns, the same numbers.

    `codes` [1, n], `cond` [1, frames, enc_emb_dim] (the voice's embedding on every frame),
    `encoded_mel` the `SpeakerCache` output for this voice and guidance mode, `times` the
    decoder's `TimeCache` (None: a private one).
    """

    def __init__(self, dit, codes: torch.Tensor, cond: torch.Tensor, encoded_mel: torch.Tensor,
                 guidance_scale: float, times: TimeCache | None = None) -> None:
        if dit.config._attn_implementation != "sdpa":  # the layers are restated with sdpa's attention
            raise ValueError(f"DiTVelocity restates the DiT's sdpa attention, not "
                             f"{dit.config._attn_implementation!r}: load token2wav with attn_implementation='sdpa'")
        self.dit = dit
        self.times = times or TimeCache(dit)
        self.guidance_scale = guidance_scale
        self.guided = guidance_scale >= GUIDANCE_OFF
        code = dit.text_embed(codes, drop_code=False)
        if self.guided:
            cond = torch.cat([cond, torch.zeros_like(cond)], dim=0)
            code = torch.cat([code, dit.text_embed(codes, drop_code=True)], dim=0)
        self.batch, frames = cond.shape[0], cond.shape[1]
        encoded_mel = encoded_mel.unsqueeze(1).repeat(1, frames, 1)
        # Everything `DiTInputEmbedding` concatenates after the noisy mel, in its order.
        self.conditioning = torch.cat((encoded_mel, code, cond), dim=-1)
        position_ids = torch.arange(frames, device=cond.device)[None, :].repeat(self.batch, 1)
        like = cond.new_empty(self.batch, frames, dit.hidden_size)  # the hidden states' dtype and device
        cos, sin = dit.rotary_embed(like, position_ids)
        # `apply_rotary_pos_emb(deinterleave(q), ...)` = q[P] * cos + rotate_half(q[P]) * sin, and
        # rotate_half(y) * sin = y[R] * (sin with its first half negated): so q[P] * cos + q[P o R] * sin'.
        head_dim = cos.shape[-1]
        half = head_dim // 2
        deinterleave = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2))).to(cos.device)
        rotated = torch.cat((deinterleave[half:], deinterleave[:half]))
        self.rope = (deinterleave, rotated, cos.unsqueeze(1),
                     torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).unsqueeze(1))
        # Each layer's block mask (key block minus query block within its look-back / look-ahead), in
        # the additive form SDPA turns a boolean mask into.
        blocks = torch.arange(frames, device=cond.device) // dit.block_size
        block_diff = (blocks[None, :] - blocks[:, None]).expand(self.batch, dit.num_attention_heads, frames, frames)
        self.masks = []
        for block in dit.transformer_blocks:
            allowed = (block_diff >= -float(block.look_backward_block)) & (block_diff <= float(block.look_ahead_block))
            self.masks.append(torch.zeros_like(allowed, dtype=like.dtype).masked_fill_(allowed.logical_not(),
                                                                                      float("-inf")))

    def __call__(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        dit = self.dit
        mod = self.times.get(t, self.batch)
        hidden = torch.cat([x, x], dim=0) if self.guided else x
        hidden = dit.input_embed.proj(torch.cat((hidden, self.conditioning), dim=-1))
        for block, mask, terms in zip(dit.transformer_blocks, self.masks, mod.layers):
            hidden = self._layer(block, hidden, mask, terms)
        scale, shift = mod.final
        out = dit.proj_out(dit.norm_out.norm(hidden) * scale + shift)
        if not self.guided:
            return out
        guided, null = torch.chunk(out, 2, dim=0)
        return guided + (guided - null) * self.guidance_scale

    def _layer(self, block, hidden: torch.Tensor, mask: torch.Tensor, terms: tuple) -> torch.Tensor:
        """`DiTDecoderLayer.forward` (with `DiTAttention` and sdpa's attention), eval mode."""
        scale_msa, shift_msa, gate_msa, scale_mlp, shift_mlp, gate_mlp = terms
        norm = block.attn_norm.norm(hidden) * scale_msa + shift_msa
        attn = block.attn
        batch, heads = hidden.shape[0], attn.heads
        query, key, value = attn.to_q(norm), attn.to_k(norm), attn.to_v(norm)
        head_dim = key.shape[-1] // heads
        query = query.view(batch, -1, heads, head_dim).transpose(1, 2)
        key = key.view(batch, -1, heads, head_dim).transpose(1, 2)
        value = value.view(batch, -1, heads, head_dim).transpose(1, 2)
        # Only the first head gets the rotary embedding (the released model's training quirk).
        deinterleave, rotated, cos, sin = self.rope
        for states in (query, key):
            first = states[:, :1]
            first[...] = first.index_select(-1, deinterleave) * cos + first.index_select(-1, rotated) * sin
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).contiguous().reshape(batch, -1, heads * head_dim)
        hidden = hidden + gate_msa * attn.to_out[0](out)
        norm = block.ff_norm(hidden) * scale_mlp + shift_mlp
        ff = block.ff.ff
        hidden = hidden + gate_mlp * ff[3](ff[1](ff[0](norm)))
        return hidden
