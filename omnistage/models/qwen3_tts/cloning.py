"""Voice cloning (Base checkpoints): a reference clip -> its codes and speaker embedding.

As the authors' `create_voice_clone_prompt`, at the 24 kHz both parts take (the clip is
resampled to it first):

- the speaker embedding: a log-mel spectrogram (n_fft 1024, hop 256, 128 slaney mels up to
  12 kHz, magnitudes, reflect-padded, as their `mel_spectrogram`) through the checkpoint's
  ECAPA-TDNN `speaker_encoder` (transformers' Qwen2.5-Omni `ECAPA_TimeDelayNet`: the
  same network and names). It stands where a CustomVoice speaker's codec embedding goes;
- the clip's codes (in-context mode, with `ref_text`): the speech tokenizer's encoder, a
  transformers `MimiModel` without its decoder half, first `encoder_valid_num_quantizers`
  codebooks, ceil(samples / 1920) frames.

The mel filters are transformers' `mel_filter_bank` (slaney scale and norm: what
`librosa.filters.mel`, the authors' source, computes).
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from omnistage.models.qwen3_tts.modeling import MIMI_4_NAMES, read_config

SAMPLE_RATE = 24000


def mel_spectrogram(audio: torch.Tensor, n_fft: int = 1024, num_mels: int = 128, hop: int = 256, win: int = 1024,
                    fmin: float = 0, fmax: float = 12000) -> torch.Tensor:
    """[B, samples] at 24 kHz -> [B, num_mels, frames] log mel magnitudes."""
    from transformers.audio_utils import mel_filter_bank

    basis = mel_filter_bank(num_frequency_bins=n_fft // 2 + 1, num_mel_filters=num_mels, min_frequency=fmin,
                            max_frequency=fmax, sampling_rate=SAMPLE_RATE, norm="slaney", mel_scale="slaney")
    basis = torch.from_numpy(basis.T).float().to(audio.device)
    pad = (n_fft - hop) // 2
    audio = torch.nn.functional.pad(audio[:, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(audio, n_fft, hop_length=hop, win_length=win, window=torch.hann_window(win, device=audio.device),
                      center=False, normalized=False, onesided=True, return_complex=True)
    spec = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(basis @ spec, min=1e-5))


class VoiceCloner:
    """The Base checkpoint's speaker encoder and the speech tokenizer's encoder."""

    def __init__(self, model_path: str, device: torch.device, dtype: torch.dtype) -> None:
        from safetensors.torch import load_file
        from transformers import MimiConfig, MimiModel
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import ECAPA_TimeDelayNet

        config = read_config(model_path)
        self.device, self.dtype = device, dtype
        self.speaker_encoder = ECAPA_TimeDelayNet(SimpleNamespace(**config["speaker_encoder_config"]))
        weights = {}
        for file in sorted(Path(model_path).glob("*.safetensors")):
            weights.update({k[len("speaker_encoder."):]: v for k, v in load_file(str(file)).items()
                            if k.startswith("speaker_encoder.")})
        self.speaker_encoder.load_state_dict(weights)
        self.speaker_encoder.to(device, dtype).eval()

        folder = Path(model_path) / "speech_tokenizer"
        tokenizer = read_config(folder)
        mimi = MimiConfig(**{k: v for k, v in tokenizer["encoder_config"].items() if k != "model_type"})
        mimi.decoder_config = None  # the encoder half only, as the released files hold
        self.encoder = MimiModel(mimi)
        encoder_weights = {}
        for file in sorted(folder.glob("*.safetensors")):
            for key, value in load_file(str(file)).items():
                for new, old in MIMI_4_NAMES:
                    if key.startswith("encoder." + old):
                        encoder_weights[new + key[len("encoder." + old):]] = value
                        break
        missing, unexpected = self.encoder.load_state_dict(encoder_weights, strict=False)
        if missing or unexpected:
            raise ValueError(f"{folder}: encoder weights do not match Mimi: missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}")
        self.encoder.to(device, torch.float32).eval()
        self.num_quantizers = tokenizer.get("encoder_valid_num_quantizers", 16)
        self.downsample = tokenizer.get("encode_downsample_rate", 1920)

    @torch.inference_mode()
    def speaker_embedding(self, audio: np.ndarray) -> torch.Tensor:
        """[samples] at 24 kHz -> [enc_dim]."""
        mels = mel_spectrogram(torch.from_numpy(audio)[None].to(self.device)).transpose(1, 2)
        return self.speaker_encoder(mels.to(self.dtype))[0]

    @torch.inference_mode()
    def codes(self, audio: np.ndarray) -> torch.Tensor:
        """[samples] at 24 kHz -> [frames, num_quantizers] long."""
        values = torch.from_numpy(audio)[None, None].to(self.device, torch.float32)
        codes = self.encoder.encode(values).audio_codes[0, :self.num_quantizers]
        return codes[:, :math.ceil(audio.shape[0] / self.downsample)].T.contiguous()

    def close(self) -> None:
        self.speaker_encoder = self.encoder = None


def clone_inputs(cloner: VoiceCloner, audio: np.ndarray, rate: int, in_context: bool) -> dict[str, Any]:
    from omnistage.media.audio import resample

    audio = np.asarray(audio, dtype=np.float32)
    if rate != SAMPLE_RATE:
        audio = resample(audio, rate, SAMPLE_RATE)
    return {"speaker": cloner.speaker_embedding(audio), "codes": cloner.codes(audio) if in_context else None}
