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
