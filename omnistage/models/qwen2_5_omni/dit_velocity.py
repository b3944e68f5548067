"""The token2wav DiT's velocity field over one window, with its step-invariant inputs computed once.

`Qwen2_5OmniToken2WavDiTModel.sample` calls the DiT's `forward` at every ODE evaluation
(Runge-Kutta 4: 4 per interval, 36 for the reference's 10 time points), and each call
recomputes what depends only on the window and the voice, not on the time or the noisy
mel: the speaker encoder (an ECAPA-TDNN over the voice's reference mel, with its zeroed
guidance twin), the code embeddings, the rotary tables and the block mask. On a small
DiT that is about half of every evaluation, so it is most of the first audio chunk's cost.

`DiTVelocity` runs the same modules in the same order on the same tensors, so it gives
the reference forward's numbers exactly (`tests/models/test_qwen2_5_omni.py` checks it
against `forward`), but computes those parts once per window, and the speaker encoder
once per voice and guidance mode (`SpeakerCache`). Only the top-level `forward` is
restated; the layers are the model's own.
"""

from __future__ import annotations

import torch

GUIDANCE_OFF = 1e-5
"""Below this guidance scale the reference runs one unguided pass (`sample`'s threshold)."""


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


class DiTVelocity:
    """v(t, x) of `dit` over one window: what `sample`'s ODE function returns, the same numbers.

    `codes` [1, n], `cond` [1, frames, enc_emb_dim] (the voice's embedding on every frame),
    `encoded_mel` the `SpeakerCache` output for this voice and guidance mode.
    """

    def __init__(self, dit, codes: torch.Tensor, cond: torch.Tensor, encoded_mel: torch.Tensor,
                 guidance_scale: float) -> None:
        self.dit = dit
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
        self.position_embeddings = dit.rotary_embed(like, position_ids)
        # Block index of each key minus that of each query: the layers' look-back/look-ahead masks read it.
        blocks = torch.arange(frames, device=cond.device) // dit.block_size
        self.block_diff = (blocks[None, :] - blocks[:, None]).expand(self.batch, dit.num_attention_heads,
                                                                     frames, frames)

    def __call__(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        dit = self.dit
        time_embedding = dit.time_embed(t.repeat(self.batch))
        hidden = torch.cat([x, x], dim=0) if self.guided else x
        hidden = dit.input_embed.proj(torch.cat((hidden, self.conditioning), dim=-1))
        for block in dit.transformer_blocks:
            hidden = block(hidden, time_embedding, position_embeddings=self.position_embeddings,
                           block_diff=self.block_diff)
        out = dit.proj_out(dit.norm_out(hidden, time_embedding))
        if not self.guided:
            return out
        guided, null = torch.chunk(out, 2, dim=0)
        return guided + (guided - null) * self.guidance_scale
