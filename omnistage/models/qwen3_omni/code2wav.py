"""Qwen3-Omni code2wav as a generation-engine decoder: codec frames [frames, G] -> 24 kHz audio.

`Qwen3OmniMoeCode2Wav` embeds a frame's G codes (mean of the codebook embeddings), runs a
sliding-window causal transformer, then causal (transposed) convolutions up to 1920 samples
per frame. Everything in it is causal, so a stream is decoded chunk by chunk with its
state carried (as generation/mimi.py does for Mimi), and each chunk costs its own frames:

- the transformer keeps, per layer, the keys and values of the stream's last
  `sliding_window - 1` positions (all a new position can attend to:
  generation/window_cache.py);
- causal convolutions keep their last `padding` inputs as the next chunk's left context,
  instead of the zeros a fresh decode pads with;
- causal transposed convolutions keep the part of their output that spills into the next
  chunk and add it there (overlap-add); the samples a one-shot decode trims on the left
  (Qwen3-Omni's `left_pad`) are trimmed from the stream's first chunk only, and the
  right trim is the spill itself, never emitted.

So the streamed waveform equals the one-shot decode of all the stream's frames up to float
rounding (tests/models/test_code2wav_stream.py), whatever the chunking. Chunks of several
streams share one pass (`_pass` takes rows of any lengths: right-padded, causality keeping
the padding out of every real sample, padded inputs zeroed before transposed convolutions
so they leave nothing in the carried tails); `decode` gives each chunk length its own pass.
Nothing at the audio rate is done per stream: each layer cuts every stream's carried state from
the batch in one op, and the activations (SnakeBeta) run in place, the same float ops as the
module's; a per-stream copy or a fresh tensor there costs more than the math.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from omnistage.generation.decoder import Decoder
from omnistage.generation.window_cache import WindowCache, WindowKV
from omnistage.models.qwen3_omni.weights import load_code2wav

SAMPLE_RATE = 24000  # a fact of the released model that its config does not store


class _Stream:
    def __init__(self, num_layers: int) -> None:
        self.kv = WindowKV(num_layers)  # the transformer's keys and values within its window
        self.carry: dict[nn.Module, torch.Tensor] = {}  # per conv layer: left context or overlap-add tail, [C, n]
        self.prefix: torch.Tensor | None = None  # [n, G] frames decoded before the first chunk, not emitted
        self.drop = 0  # samples to cut from the head of the next output (the prefix's)

    def clear(self) -> None:
        self.kv.clear()
        self.carry.clear()
        self.prefix = None


class Code2Wav(Decoder):
    supports_prepacked_linears = True  # the decoder's code only calls its linears
    sample_rate = SAMPLE_RATE
    chunk_frames = None  # all pending frames of a stream in one pass

    def __init__(self, model, device: torch.device) -> None:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeCausalConvNet,
            Qwen3OmniMoeCausalTransConvNet,
            Qwen3OmniMoeCode2WavDecoderBlock,
            Qwen3OmniMoeCode2WavDecoderResidualUnit,
            Qwen3OmniMoeConvNeXtBlock,
            Qwen3OmniMoeSnakeBeta,
        )

        self._types = (Qwen3OmniMoeCausalConvNet, Qwen3OmniMoeCausalTransConvNet, Qwen3OmniMoeConvNeXtBlock,
                       Qwen3OmniMoeCode2WavDecoderResidualUnit, Qwen3OmniMoeCode2WavDecoderBlock,
                       Qwen3OmniMoeSnakeBeta)
        self.model = model
        self.device = device
        config = model.config
        self.num_quantizers = config.num_quantizers
        self.codebook_size = config.codebook_size
        self.num_layers = config.num_hidden_layers
        self.window = config.sliding_window
        self.upsample = int(model.total_upsample)
        for module in model.modules():
            if isinstance(module, Qwen3OmniMoeCausalConvNet) and module.stride != 1:
                raise ValueError("streamed code2wav expects stride-1 causal convolutions")
            if isinstance(module, Qwen3OmniMoeCausalTransConvNet):
                overhang = module.conv.kernel_size[0] - module.conv.stride[0]
                if module.right_pad != overhang or module.left_pad not in (0, overhang):
                    raise ValueError("streamed code2wav expects transposed convolutions trimmed by their overhang")
        self.live: set[int] = set()  # ids of the open streams' states (freed by close_stream)

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype, max_streams: int) -> Code2Wav:
        return cls(load_code2wav(model_path, device), device)

    def parse(self, codes: Any) -> torch.Tensor:
        """[frames, num_quantizers] integer codes in [0, codebook_size)."""
        t = codes if torch.is_tensor(codes) else torch.as_tensor(codes)
        if t.numel() == 0:
            t = t.long().reshape(0, self.num_quantizers)
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.ndim != 2 or t.shape[1] != self.num_quantizers:
            raise ValueError(f"code2wav codes must be integer [frames, {self.num_quantizers}], "
                             f"got {t.dtype} {tuple(t.shape)}")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.codebook_size):
            raise ValueError(f"code2wav codes must be in [0, {self.codebook_size}), got [{int(t.min())}, {int(t.max())}]")
        return t.to(self.device)

    def open_stream(self, options: dict | None = None) -> _Stream:
        stream = _Stream(self.num_layers)
        self.live.add(id(stream))
        return stream

    def close_stream(self, state: _Stream) -> None:
        state.clear()
        self.live.discard(id(state))

    # --- the pass -----------------------------------------------------------------------------

    @torch.inference_mode()
    def decode(self, codes: list[torch.Tensor], states: list[_Stream]) -> list[np.ndarray]:
        rows = []
        for c, st in zip(codes, states):
            if st.prefix is not None and c.shape[0]:  # decoded with the first frames, its samples cut
                c, st.prefix = torch.cat([st.prefix, c]), None
            rows.append(c)
        # One pass per chunk length: equal chunks of several streams batch well (the streams' first
        # and last chunks are shorter), while padding a short chunk to a long one costs more than a
        # pass of its own on CPU (benchmarks/bench_codec.py).
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(rows):
            if c.shape[0]:
                groups.setdefault(c.shape[0], []).append(i)
        out = [np.zeros(0, dtype=np.float32) for _ in rows]
        for group in groups.values():
            for i, wav in zip(group, self._pass([rows[i] for i in group], [states[i] for i in group])):
                out[i] = wav
        return out

    def _pass(self, codes: list[torch.Tensor], states: list[_Stream]) -> list[np.ndarray]:
        lens = [c.shape[0] for c in codes]
        batch = torch.zeros(len(codes), self.num_quantizers, max(lens), dtype=torch.long, device=self.device)
        for i, c in enumerate(codes):
            batch[i, :, :lens[i]] = c.T
        hidden = self._transformer(self._embed(batch, lens, states), lens, states).transpose(1, 2)
        for blocks in self.model.upsample:
            for block in blocks:
                hidden, lens = self._layer(block, hidden, lens, states)
        for block in self.model.decoder:
            hidden, lens = self._layer(block, hidden, lens, states)
        audio = hidden[:, 0].clamp(min=-1, max=1).float().cpu().numpy()
        out = []
        for st, wav, n in zip(states, audio, lens):
            out.append(wav[st.drop:n].copy())
            st.drop = max(0, st.drop - n)
        return out

    def _embed(self, codes: torch.Tensor, lens: list[int], states: list[_Stream]) -> torch.Tensor:
        """[B, G, T] codes -> [B, T, hidden] transformer inputs."""
        return self.model.code_embedding(codes + self.model.code_offset).mean(1)

    def _run_transformer(self, hidden: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.model.pre_transformer(inputs_embeds=hidden, **kwargs).last_hidden_state

    def _transformer(self, hidden: torch.Tensor, lens: list[int], states: list[_Stream]) -> torch.Tensor:
        t = hidden.shape[1]
        cache = WindowCache([s.kv for s in states], self.window)
        mask = cache.mask(t, hidden.device)
        out = self._run_transformer(hidden, attention_mask={"sliding_attention": mask, "full_attention": mask},
                                    position_ids=cache.positions(t, hidden.device), cache=cache, use_cache=True)
        cache.commit(lens)
        return out

    def _layer(self, layer: nn.Module, x: torch.Tensor, lens: list[int], states: list[_Stream]):
        conv, transposed, convnext, residual, block, snake = self._types
        if isinstance(layer, snake):
            return _snake(layer, x), lens
        if isinstance(layer, transposed):
            return self._transposed_conv(layer, x, lens, states)
        if isinstance(layer, conv):
            return self._conv(layer, x, lens, states), lens
        if isinstance(layer, convnext):  # Qwen3OmniMoeConvNeXtBlock.forward, its depthwise conv carried
            h = self._conv(layer.dwconv, x, lens, states).permute(0, 2, 1)
            h = layer.pwconv2(layer.act(layer.pwconv1(layer.norm(h))))
            return x + (layer.gamma * h).permute(0, 2, 1), lens
        if isinstance(layer, residual):  # Qwen3OmniMoeCode2WavDecoderResidualUnit.forward
            h = self._conv(layer.conv1, _snake(layer.act1, x), lens, states)
            return self._conv(layer.conv2, _snake(layer.act2, h), lens, states).add_(x), lens
        if isinstance(layer, block):
            for sub in layer.block:
                x, lens = self._layer(sub, x, lens, states)
            return x, lens
        return layer(x), lens  # activations

    def _conv(self, layer: nn.Module, x: torch.Tensor, lens: list[int], states: list[_Stream]) -> torch.Tensor:
        """A causal conv whose left padding is the stream's previous inputs (zeros before its first)."""
        pad = layer.padding
        if pad == 0:
            return layer.conv(x)
        context = [st.carry.get(layer) for st in states]
        context = torch.stack([x.new_zeros(x.shape[1], pad) if c is None else c for c in context])
        full = torch.cat([context, x], dim=-1)
        # Each row's next left context: its last `pad` inputs, full[i, :, lens[i]:lens[i] + pad].
        if all(n == x.shape[-1] for n in lens):
            tails = full[:, :, -pad:].clone()
        else:
            index = torch.tensor(lens, device=x.device)[:, None] + torch.arange(pad, device=x.device)
            tails = full.gather(2, index[:, None].expand(-1, x.shape[1], -1))
        for st, tail in zip(states, tails):
            st.carry[layer] = tail
        return layer.conv(full)

    def _transposed_conv(self, layer: nn.Module, x: torch.Tensor, lens: list[int], states: list[_Stream]):
        """A causal transposed conv: the output past the chunk's end is kept and added to the next chunk;
        the left trim applies to the stream's first chunk only."""
        conv = layer.conv
        stride, overhang = conv.stride[0], conv.kernel_size[0] - conv.stride[0]
        if overhang and min(lens) < x.shape[-1]:  # padded frames must leave nothing in the tails
            valid = torch.arange(x.shape[-1], device=x.device) < torch.tensor(lens, device=x.device)[:, None]
            x = torch.where(valid[:, None], x, 0)
        y = conv(x)
        prevs = [st.carry.get(layer) for st in states]
        skips = [layer.left_pad if prev is None else 0 for prev in prevs]
        if overhang:
            started = [i for i, prev in enumerate(prevs) if prev is not None]
            if len(started) == len(states):
                y[:, :, :overhang] += torch.stack(prevs)
            elif started:
                y[started, :, :overhang] += torch.stack([prevs[i] for i in started])
            # Each row's spill past its chunk: y[i, :, lens[i] * stride:][:overhang], the bias left out
            # (the chunk that owns the sample adds it).
            if all(n == x.shape[-1] for n in lens):
                tails = y[:, :, x.shape[-1] * stride:].clone()
            else:
                index = torch.tensor(lens, device=y.device)[:, None] * stride + torch.arange(overhang, device=y.device)
                tails = y.gather(2, index[:, None].expand(-1, y.shape[1], -1))
            if conv.bias is not None:
                tails -= conv.bias[:, None]
            for st, tail in zip(states, tails):
                st.carry[layer] = tail
        new_lens = [n * stride - skip for n, skip in zip(lens, skips)]
        if len(set(skips)) == 1:  # one offset for every row
            return y[..., skips[0]:x.shape[-1] * stride], new_lens
        out = y.new_zeros(y.shape[0], y.shape[1], max(new_lens))
        for i, (skip, n) in enumerate(zip(skips, new_lens)):
            out[i, :, :n] = y[i, :, skip:skip + n]
        return out, new_lens

    def close(self) -> None:
        self.model = None


def _snake(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Qwen3OmniMoeSnakeBeta.forward, x + sin(x * alpha) ** 2 / beta, with the same float operations done
    in place on one new tensor: the activations run at the audio rate, where fresh tensors cost most."""
    alpha, beta = layer.alpha.exp()[:, None], layer.beta.exp()[:, None]
    s = (x * alpha).sin_()
    return s.mul_(s).mul_(1.0 / (beta + layer.no_div_by_zero)).add_(x)
