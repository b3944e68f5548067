"""OmniVoice offline: text (+ a voice to clone, or a described voice) -> codes -> 24 kHz audio.

Loads the folder the authors' `OmniVoice.from_pretrained` loads: the network (modeling.py),
its text tokenizer, and the Higgs-Audio v2 audio tokenizer in `audio_tokenizer/`, whose
decoder is omnistage's (`models.higgs_audio.codec_model`). Requests of one batch are
unmasked together (decoding.py), each with its own generator.

A voice is cloned from a clip as the authors' `create_voice_clone_prompt` does (mono at the
tokenizer's rate, a quiet clip raised to RMS 0.1, cut to whole frames, encoded by the audio
tokenizer's encoder, the transcript ended with a full stop), without their silence removal.

Loudness follows the authors' post-processing: with a cloned voice quieter than RMS 0.1 the
output is scaled by ref_rms / 0.1; without one it is peak-normalised to 0.5. Their silence
removal (pydub) and fades are not done.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from omnistage.models.omnivoice.decoding import UnmaskParams, UnmaskState, unmask_step
from omnistage.models.omnivoice.modeling import OmniVoiceModel
from omnistage.models.omnivoice.prompt import conditional_inputs, estimate_frames

# The authors' sentence ends (utils/text.py): a transcript without one gets a full stop.
END_PUNCTUATION = frozenset(";:,.!?…)]}\"'“”‘’；：，。！？、）】")


@dataclass(frozen=True)
class Voice:
    """A voice to clone: its transcript, its codes [codebooks, frames] and its RMS loudness."""

    ref_text: str
    ref_codes: torch.Tensor
    ref_rms: float


@dataclass(frozen=True)
class SpeechRequest:
    text: str
    voice: Voice | None = None
    instruct: str | None = None
    language: str | None = None
    num_frames: int | None = None
    """None: estimated from the text (at the voice's pace, when cloning)."""
    seed: int | None = None
    params: UnmaskParams = UnmaskParams()


class OmniVoiceSpeaker:
    def __init__(self, path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import AutoTokenizer

        from omnistage.models.higgs_audio.codec_model import HiggsCodecDecoder

        self.model = OmniVoiceModel.from_pretrained(path, device, dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.codec = HiggsCodecDecoder.from_pretrained(Path(path) / "audio_tokenizer", device)
        self.encoder = None  # loaded with the first clip to clone
        self.path = Path(path)
        self.sample_rate = self.codec.sample_rate
        self.device = torch.device(device)

    @torch.inference_mode()
    def voice_from_clip(self, audio: np.ndarray, sample_rate: int, ref_text: str) -> Voice:
        """A voice to clone from a mono float clip and its transcript."""
        from omnistage.media.audio import resample
        from omnistage.models.higgs_audio.codec_model import HiggsCodecEncoder

        if self.encoder is None:
            self.encoder = HiggsCodecEncoder.from_pretrained(self.path / "audio_tokenizer", self.device)
        wave = resample(np.asarray(audio, dtype=np.float32), sample_rate, self.sample_rate)
        rms = float(np.sqrt(np.mean(wave ** 2)))
        if 0 < rms < 0.1:
            wave = wave * (0.1 / rms)
        wave = wave[:len(wave) - len(wave) % self.codec.hop_length]
        if not len(wave):
            raise ValueError("ref_audio: the clip is shorter than one frame of the audio tokenizer")
        codes = self.encoder(torch.from_numpy(wave)[None, None].to(self.device))[0]
        ref_text = ref_text.strip()
        if ref_text[-1] not in END_PUNCTUATION:
            ref_text += "。" if any("\u4e00" <= c <= "\u9fff" for c in ref_text) else "."
        return Voice(ref_text, codes, rms)

    def state(self, request: SpeechRequest) -> UnmaskState:
        voice = request.voice
        frames = request.num_frames or estimate_frames(
            request.text, voice.ref_text if voice else None, voice.ref_codes.shape[-1] if voice else None)
        input_ids, audio_mask = conditional_inputs(
            self.tokenizer, self.model.num_codebooks, self.model.mask_id, request.text, frames,
            ref_text=voice.ref_text if voice else None, ref_codes=voice.ref_codes if voice else None,
            language=request.language, instruct=request.instruct)
        seed = request.seed if request.seed is not None else torch.seed() % 2**63
        return UnmaskState(input_ids.to(self.device), audio_mask.to(self.device), frames, request.params,
                           torch.Generator("cpu").manual_seed(seed))

    @torch.inference_mode()
    def codes(self, requests: list[SpeechRequest]) -> list[torch.Tensor]:
        """Each request's codes [codebooks, frames], the batch unmasked together."""
        states = [self.state(r) for r in requests]
        while running := [s for s in states if not s.is_done]:
            unmask_step(self.model, running)
        return [s.codes.clone() for s in states]

    @torch.inference_mode()
    def audio(self, codes: torch.Tensor, voice: Voice | None = None) -> np.ndarray:
        """float32 mono waveform of `codes` [codebooks, frames], at the authors' loudness."""
        wave = self.codec(codes[None].to(self.device))[0, 0].float().cpu().numpy()
        if voice is not None:
            return wave * (voice.ref_rms / 0.1) if voice.ref_rms < 0.1 else wave
        peak = float(np.abs(wave).max()) if wave.size else 0.0
        return wave / peak * 0.5 if peak > 1e-6 else wave
