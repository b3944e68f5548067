"""Streaming, batched decode of the Mimi codec (CSM's and Moshi's audio decoder).

transformers' `MimiModel.decode` decodes a whole clip. Decoding a clip in chunks with it
would restart the decoder transformer and the convolutions at every chunk boundary, so
here the same modules are run with state carried per stream:

- the quantizer's dequantization is per frame: no state;
- causal transposed convolutions (the 2x upsample, SEANet's upsampling stages) keep the
  part of their output that spills into the next chunk and add it there (overlap-add);
- the decoder transformer keeps the keys and values of each stream's last
  `sliding_window - 1` positions (generation/window_cache.py), so rows of different streams
  and lengths share one forward and a chunk's attention costs the same wherever it is in
  the stream;
- causal convolutions keep their last `padding_total` inputs as the next chunk's left
  context, instead of the zero padding a fresh decode uses.

Chunks of one step are right-padded to a common length; causality keeps the padding out
of every real sample, and padded inputs are zeroed before transposed convolutions so
they leave nothing in the carried tails. With a causal Mimi (the released checkpoints)
the chunked output equals a one-shot decode up to float rounding (tests/generation).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from omnistage.generation.decoder import Decoder
from omnistage.generation.window_cache import WindowCache, WindowKV


class _Stream:
    def __init__(self, num_layers: int) -> None:
        self.kv = WindowKV(num_layers)  # the decoder transformer's keys and values within its window
        self.carry: dict[nn.Module, torch.Tensor] = {}  # per layer: left context or overlap-add tail, [C, n]


class MimiDecoder(Decoder):
    supports_prepacked_linears = True  # Mimi's code only calls its linears (it reads conv biases)

    def __init__(self, model, max_streams: int, device: torch.device) -> None:
        from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiConvTranspose1d, MimiResnetBlock

        self._conv_types = (MimiConv1d, MimiConvTranspose1d, MimiResnetBlock)
        cfg = model.config
        if not cfg.use_causal_conv or cfg.trim_right_ratio != 1.0:
            raise ValueError("streaming Mimi decode needs a causal codec (use_causal_conv=True, trim_right_ratio=1.0)")
        self.model = model
        self.device = device
        self.sample_rate = cfg.sampling_rate
        self.num_quantizers = cfg.num_quantizers
        self.codebook_size = cfg.codebook_size
        self.frame_rate = cfg.frame_rate
        self.chunk_frames = max(1, round(cfg.frame_rate))  # about one second of audio per step
        decoder = model.decoder
        self.upsample = decoder.upsample
        self.transformer = decoder.decoder_transformer
        self.seanet = decoder.decoder_seanet.layers
        self.window = cfg.sliding_window
        up = decoder.upsample.conv.stride[0] if decoder.upsample is not None else 1
        self.samples_per_frame = up * math.prod(cfg.upsampling_ratios)
        self.max_frames = cfg.max_position_embeddings // up  # the positions the model was made for
        self.num_layers = cfg.num_hidden_layers
        self.live: set[int] = set()  # ids of the open streams' states (freed by close_stream)

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype, max_streams: int) -> MimiDecoder:
        """A Mimi checkpoint, or the codec inside a CSM (`codec_model`) or Moshi (`audio_encoder`)
        checkpoint (only its weights are read)."""
        from transformers import AutoConfig, MimiModel

        config = AutoConfig.from_pretrained(model_path)
        if config.model_type == "mimi":
            model = MimiModel.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa")
            return cls(model.to(device).eval(), max_streams, device)
        for key, prefix in (("codec_config", "codec_model."), ("audio_encoder_config", "audio_encoder.")):
            codec_config = getattr(config, key, None)
            if codec_config is not None and codec_config.model_type == "mimi":
                state = _load_prefixed(Path(model_path), prefix)
                model = MimiModel.from_pretrained(None, config=codec_config, state_dict=state, dtype=dtype,
                                                  attn_implementation="sdpa")
                return cls(model.to(device).eval(), max_streams, device)
        raise ValueError(f"{model_path} is neither a Mimi checkpoint nor one with a Mimi codec_config or "
                         f"audio_encoder_config (model_type={config.model_type!r})")

    # --- requests ---------------------------------------------------------------------------

    def parse(self, codes: Any) -> torch.Tensor:
        """[frames, num_quantizers] integer codes in [0, codebook_size)."""
        t = torch.as_tensor(codes)
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError(f"Mimi codes must be integers, got {t.dtype}")
        if t.ndim != 2 or t.shape[1] != self.num_quantizers:
            raise ValueError(f"Mimi codes must have shape [frames, {self.num_quantizers}], got {list(t.shape)}")
        if t.numel() and (t.min() < 0 or t.max() >= self.codebook_size):
            raise ValueError(f"Mimi codes must be in [0, {self.codebook_size}), got [{t.min()}, {t.max()}]")
        return t.long()

    def open_stream(self) -> _Stream:
        stream = _Stream(self.num_layers)
        self.live.add(id(stream))
        return stream

    def close_stream(self, state: _Stream) -> None:
        state.kv.clear()
        state.carry.clear()
        self.live.discard(id(state))

    # --- the pass -----------------------------------------------------------------------------

    @torch.inference_mode()
    def decode(self, codes: list[torch.Tensor], states: list[_Stream]) -> list[np.ndarray]:
        lens = [c.shape[0] for c in codes]
        batch = torch.zeros(len(codes), self.num_quantizers, max(lens), dtype=torch.long, device=self.device)
        for i, c in enumerate(codes):
            batch[i, :, :lens[i]] = c.T.to(self.device)
        x = self.model.quantizer.decode(batch)  # [B, C, T] latents
        if self.upsample is not None:
            x, lens = self._transposed_conv(self.upsample, x, lens, states)
        x = self._transformer(x, lens, states)
        for layer in self.seanet:
            x, lens = self._layer(layer, x, lens, states)
        audio = x[:, 0].float().cpu().numpy()
        return [audio[i, :n].copy() for i, n in enumerate(lens)]

    def _transformer(self, x: torch.Tensor, lens: list[int], states: list[_Stream]) -> torch.Tensor:
        t = x.shape[-1]
        cache = WindowCache([s.kv for s in states], self.window)
        out = self.transformer(x.transpose(1, 2), attention_mask=cache.mask(t, x.device),
                               position_ids=cache.positions(t, x.device), cache=cache, use_cache=True)
        cache.commit(lens)
        return out.last_hidden_state.transpose(1, 2)

    def _layer(self, layer: nn.Module, x: torch.Tensor, lens: list[int], states: list[_Stream]):
        conv1d, transposed, resnet = self._conv_types
        if isinstance(layer, transposed):
            return self._transposed_conv(layer, x, lens, states)
        if isinstance(layer, conv1d):
            return self._conv(layer, x, lens, states), lens
        if isinstance(layer, resnet):
            h = x
            for sub in layer.block:
                h = self._conv(sub, h, lens, states) if isinstance(sub, conv1d) else sub(h)
            residual = self._conv(layer.shortcut, x, lens, states) if isinstance(layer.shortcut, conv1d) else x
            return residual + h, lens
        return layer(x), lens  # activations

    def _conv(self, layer: nn.Module, x: torch.Tensor, lens: list[int], states: list[_Stream]) -> torch.Tensor:
        """A causal MimiConv1d whose left padding is the stream's previous inputs."""
        pad = int(layer.padding_total)
        if layer.conv.stride[0] != 1:
            raise ValueError("streaming Mimi decode expects stride-1 convolutions in the decoder")
        if pad == 0:
            return layer.conv(x)
        context = []
        for i, s in enumerate(states):
            prev = s.carry.get(layer)
            if prev is None:  # a stream's first chunk: the padding a one-shot decode would use
                prev = x[i, :, :1].expand(-1, pad) if layer.pad_mode == "replicate" else x.new_zeros(x.shape[1], pad)
            context.append(prev)
            s.carry[layer] = torch.cat([prev, x[i, :, :lens[i]]], dim=-1)[:, -pad:]
        return layer.conv(torch.cat([torch.stack(context), x], dim=-1))

    def _transposed_conv(self, layer: nn.Module, x: torch.Tensor, lens: list[int], states: list[_Stream]):
        """A causal MimiConvTranspose1d: the output past the chunk's end is kept and added to the next chunk."""
        conv = layer.conv
        stride, overlap = conv.stride[0], conv.kernel_size[0] - conv.stride[0]
        if min(lens) < x.shape[-1]:  # padded frames must leave nothing in the tails
            valid = torch.arange(x.shape[-1], device=x.device) < torch.tensor(lens, device=x.device)[:, None]
            x = x * valid[:, None]
        y = conv(x)
        for i, s in enumerate(states):
            prev = s.carry.get(layer)
            if prev is not None:
                y[i, :, :overlap] += prev
            end = lens[i] * stride
            tail = y[i, :, end:end + overlap].clone()
            if conv.bias is not None:  # the bias is added once, by the chunk that owns the sample
                tail -= conv.bias[:, None]
            s.carry[layer] = tail
        return y[..., :x.shape[-1] * stride], [n * stride for n in lens]

    def close(self) -> None:
        self.model = None


def _load_prefixed(folder: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under `prefix` in a folder's safetensors files, with the prefix removed."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {folder}")
    state = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                if key.startswith(prefix):
                    state[key[len(prefix):]] = st.get_tensor(key)
    if not state:
        raise ValueError(f"no weights under {prefix!r} in {folder}")
    return state
