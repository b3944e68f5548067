"""The decoding half of the Higgs-Audio v2 audio tokenizer, as transformers' modules.

transformers' `HiggsAudioV2TokenizerModel` imports torchaudio at module level (its encoder
resamples with it), so it cannot be imported here. Its `decode` needs none of that: the
residual VQ's codebooks and output projections, `fc2`, and a DAC decoder (transformers'
`DacDecoder`) with the tokenizer's two changes (`_adjust_dac_decoder`: output padding
`stride % 2` on each transposed convolution, no final tanh). `HiggsCodecDecoder` holds those
modules under the checkpoint's own names, so it loads the decoding subset of the tokenizer's
`model.safetensors` as it is, and the zoo writes tiny ones through it.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

CODEC_PREFIXES = ("quantizer.", "fc2.", "acoustic_decoder.")
"""The tokenizer checkpoint's tensors that decoding reads."""


class _Codebook(nn.Module):
    def __init__(self, codebook_size: int, codebook_dim: int) -> None:
        super().__init__()
        # All four are buffers of the checkpoint; decoding reads `embed`.
        self.inited = nn.Buffer(torch.ones(1))
        self.cluster_size = nn.Buffer(torch.zeros(codebook_size))
        self.embed = nn.Buffer(torch.zeros(codebook_size, codebook_dim))
        self.embed_avg = nn.Buffer(torch.zeros(codebook_size, codebook_dim))


class _Quantizer(nn.Module):
    def __init__(self, hidden_size: int, codebook_size: int, codebook_dim: int) -> None:
        super().__init__()
        self.codebook = _Codebook(codebook_size, codebook_dim)
        self.project_in = nn.Linear(hidden_size, codebook_dim)
        self.project_out = nn.Linear(codebook_dim, hidden_size)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """[B, T] -> [B, hidden, T]."""
        return self.project_out(F.embedding(codes, self.codebook.embed)).permute(0, 2, 1)


class _ResidualQuantizer(nn.Module):
    def __init__(self, num_quantizers: int, hidden_size: int, codebook_size: int, codebook_dim: int) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(_Quantizer(hidden_size, codebook_size, codebook_dim)
                                        for _ in range(num_quantizers))


class HiggsCodecDecoder(nn.Module):
    """codes [B, num_quantizers, frames] -> audio [B, 1, frames * hop_length], as `HiggsAudioV2TokenizerModel.decode`."""

    def __init__(self, config) -> None:
        from transformers import DacConfig
        from transformers.models.dac.modeling_dac import DacDecoder

        super().__init__()
        self.config = config
        acoustic = config.acoustic_model_config
        acoustic = acoustic if isinstance(acoustic, DacConfig) else DacConfig(**acoustic)
        self.quantizer = _ResidualQuantizer(config.num_quantizers, config.hidden_size, config.codebook_size,
                                            config.codebook_dim)
        self.fc2 = nn.Linear(config.hidden_size, acoustic.hidden_size)
        self.acoustic_decoder = DacDecoder(acoustic)
        for module in self.acoustic_decoder.modules():
            if isinstance(module, nn.ConvTranspose1d):
                module.output_padding = (module.stride[0] % 2,)
        self.acoustic_decoder.tanh = nn.Identity()
        self.hop_length = config.hop_length
        self.sample_rate = config.sample_rate

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        quantized = sum(q.decode(codes[:, i]) for i, q in enumerate(self.quantizer.quantizers))
        return self.acoustic_decoder(self.fc2(quantized.transpose(1, 2)).transpose(1, 2))

    @classmethod
    def from_pretrained(cls, path: str | Path, device: torch.device | str = "cpu") -> HiggsCodecDecoder:
        """Load the decoding tensors of a tokenizer folder (config.json + model.safetensors)."""
        from safetensors import safe_open
        from transformers import HiggsAudioV2TokenizerConfig

        path = Path(path)
        config = HiggsAudioV2TokenizerConfig.from_pretrained(path)
        model = cls(config)
        state = {}
        with safe_open(path / "model.safetensors", framework="pt") as f:
            for key in f.keys():
                if key.startswith(CODEC_PREFIXES):
                    state[key] = f.get_tensor(key)
        model.load_state_dict(state, strict=True)
        return model.float().to(device).eval()


# --- the encoding half: a reference clip -> codes (voice cloning) ----------------------------------

ENCODER_PREFIXES = ("quantizer.", "fc.", "acoustic_encoder.", "encoder_semantic.", "semantic_model.")
"""The tokenizer checkpoint's tensors that encoding reads."""


class _ResidualUnit(nn.Module):
    def __init__(self, channels: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.activation = nn.ELU()
        self.conv1 = nn.Conv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2 * dilation,
                               dilation=dilation, bias=False)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.activation(self.conv1(self.activation(x))))


class _SemanticBlock(nn.Module):
    def __init__(self, config, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.res_units = nn.ModuleList(_ResidualUnit(in_channels, config.unit_kernel_size, d)
                                       for d in config.block_dilations)
        kernel = 3 if stride == 1 else 2 * stride
        self.conv = nn.Conv1d(in_channels, out_channels, kernel, stride=stride, padding=(kernel - 1) // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.res_units:
            x = unit(x)
        return self.conv(x)


class _SemanticEncoder(nn.Module):
    """The tokenizer's `SemanticEncoder` (same names and layout)."""

    def __init__(self, config) -> None:
        super().__init__()
        size = config.semantic_hidden_size
        self.conv = nn.Conv1d(size, size, config.kernel_size, 1, config.kernel_size // 2, bias=False)
        blocks, in_channels = [], size
        for ratio, stride in zip(config.channel_ratios, config.strides):
            blocks.append(_SemanticBlock(config, in_channels, int(size * ratio), stride))
            in_channels = int(size * ratio)
        self.conv_blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        for block in self.conv_blocks:
            x = block(x)
        return x


class HiggsCodecEncoder(nn.Module):
    """audio [1, 1, samples] at the tokenizer's rate -> codes [1, num_quantizers, frames], as
    `HiggsAudioV2TokenizerModel.encode` at its highest bandwidth. The semantic model's input is
    resampled with omnistage's resampler (`media.audio.resample`), where transformers calls
    torchaudio's."""

    def __init__(self, config) -> None:
        from transformers import DacConfig, DacModel

        super().__init__()
        self.config = config
        acoustic = config.acoustic_model_config
        acoustic = acoustic if isinstance(acoustic, DacConfig) else DacConfig(**acoustic)
        self.quantizer = _ResidualQuantizer(config.num_quantizers, config.hidden_size, config.codebook_size,
                                            config.codebook_dim)
        self.fc = nn.Linear(config.hidden_size, config.hidden_size)
        self.acoustic_encoder = DacModel(acoustic).encoder
        self.encoder_semantic = _SemanticEncoder(config)
        self.semantic_model = _hubert(config.semantic_model_config)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        from transformers.audio_utils import conv1d_output_length

        from omnistage.media.audio import resample

        config = self.config
        semantic_in = torch.from_numpy(resample(audio[0, 0].cpu().numpy(), config.sample_rate,
                                                config.semantic_sample_rate))[None].to(audio.device)
        hidden = self.semantic_model(F.pad(semantic_in, (160, 160)), output_hidden_states=True).hidden_states
        features = torch.stack(list(hidden), dim=1).mean(dim=1)[:, ::max(1, config.semantic_downsample_factor)]
        semantic = self.encoder_semantic(features.transpose(1, 2))
        length = audio.shape[2]
        for conv in (m for m in self.acoustic_encoder.modules() if isinstance(m, nn.Conv1d)):
            length = conv1d_output_length(conv, length)
        pad = config.hop_length // 2
        acoustic = self.acoustic_encoder(audio if length == semantic.shape[2] else F.pad(audio, (pad, pad)))
        x = self.fc(torch.cat([acoustic, semantic], dim=1).transpose(1, 2)).transpose(1, 2)
        codes = []
        for q in self.quantizer.quantizers:
            h = q.project_in(x.permute(0, 2, 1))
            embed = q.codebook.embed
            dist = -(h.pow(2).sum(-1, keepdim=True) - 2 * h @ embed.t() + embed.pow(2).sum(-1))
            index = dist.max(dim=-1).indices
            x = x - q.decode(index)
            codes.append(index)
        return torch.stack(codes, dim=1)

    @classmethod
    def from_pretrained(cls, path: str | Path, device: torch.device | str = "cpu") -> HiggsCodecEncoder:
        from safetensors import safe_open
        from transformers import HiggsAudioV2TokenizerConfig

        path = Path(path)
        model = cls(HiggsAudioV2TokenizerConfig.from_pretrained(path))
        state = {}
        with safe_open(path / "model.safetensors", framework="pt") as f:
            for key in f.keys():
                if key.startswith(ENCODER_PREFIXES):
                    state[key] = f.get_tensor(key)
        missing, unexpected = model.load_state_dict(state, strict=False)
        # HuBERT's masked_spec_embed is a training-only parameter the tokenizer does not save.
        if [k for k in missing if not k.endswith("masked_spec_embed")] or unexpected:
            raise ValueError(f"{path}: the audio tokenizer's encoder does not match its config "
                             f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
        return model.float().to(device).eval()


def _hubert(config):
    from transformers import HubertConfig, HubertModel

    return HubertModel(config if isinstance(config, HubertConfig) else HubertConfig(**config)).eval()
