"""VoxCPM2's VAE stage: latent patches -> 48 kHz audio, streamed.

The VAE decoder is causal (audio_vae.py), so a stream voices every patch as soon as it
arrives: each window is decoded with the stream's last `context` latent steps before it (its
receptive field) and only the new steps' samples are kept, which equals the authors'
one-shot decode of all patches (up to float rounding) with no lookahead. A continuation
clone's prompt patches (`options["context_codes"]`) start the stream's history, voiced but
cut, as the authors decode them before the generated patches and cut their share.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.generation.decoder import Decoder
from omnistage.models.talker_codec.window import ContextWindow, receptive_frames
from omnistage.models.voxcpm2.audio_vae import AudioVAEConfig, load_vae_part


class VoxCPM2Codec(Decoder):
    chunk_frames = None  # all pending patches of a stream in one pass

    def __init__(self, model: torch.nn.Module, config: AudioVAEConfig, patch_size: int, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.sample_rate = config.out_sample_rate
        self.hop_length = config.decode_hop_length
        self.latent_dim, self.patch_size = config.latent_dim, patch_size
        self.context = receptive_frames(model, causal=True)

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype, max_streams: int) -> VoxCPM2Codec:
        folder = Path(model_path)
        config = json.loads((folder / "config.json").read_text())
        vae_config = AudioVAEConfig.from_dict(config.get("audio_vae_config"))
        # fp32 whatever the stage dtype, as the authors' (the VAE is small; the waveform is float).
        return cls(load_vae_part(folder, vae_config, "decoder", device), vae_config, config.get("patch_size", 4),
                   device)

    def parse(self, codes: Any) -> torch.Tensor:
        """[patches, patch_size, latent_dim] finite floats."""
        t = codes if torch.is_tensor(codes) else torch.as_tensor(codes)
        shape = (self.patch_size, self.latent_dim)
        if t.numel() == 0:
            t = t.float().reshape(0, *shape)
        if not t.dtype.is_floating_point or t.ndim != 3 or tuple(t.shape[1:]) != shape:
            raise ValueError(f"VoxCPM2 latents must be float [patches, {shape[0]}, {shape[1]}], "
                             f"got {t.dtype} {tuple(t.shape)}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError("VoxCPM2 latents must be finite")
        return t.to(self.device, torch.float32)

    def open_stream(self, options: dict | None = None) -> ContextWindow:
        stream = ContextWindow()
        context = (options or {}).get("context_codes")
        if context is not None and len(context):
            stream.history = self._steps(self.parse(context))
        return stream

    def _steps(self, patches: torch.Tensor) -> torch.Tensor:
        """[n, P, D] -> [D, n * P] latent steps (the authors' "t p d -> d (t p)")."""
        return patches.permute(2, 0, 1).reshape(self.latent_dim, -1)

    @torch.inference_mode()
    def decode(self, codes: list[torch.Tensor], states: list[ContextWindow]) -> list[np.ndarray]:
        # Rows differ in window length: one pass per row; causal: nothing held back.
        return [st.voice(self.model, self._steps(patches), context=self.context, keep=0, hop_length=self.hop_length)
                for patches, st in zip(codes, states)]

    def close(self) -> None:
        self.model = None
