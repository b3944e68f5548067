"""Audio encode/decode with soundfile and numpy (no torchaudio).

`encode_audio` turns a whole float32 waveform, [samples] (mono) or [samples, channels]
(e.g. Stable Audio's stereo), into wav/flac/mp3/pcm/opus/aac bytes (pcm interleaves channels);
`StreamingAudioEncoder` turns chunks into bytes as they arrive (raw PCM, or a WAV whose
header declares an unknown length so players can start at once).
"""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile as sf

AUDIO_FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")
_SF_FORMATS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", None)}
MIME_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg",
              "aac": "audio/aac"}


def to_pcm16(audio: np.ndarray) -> bytes:
    """Little-endian int16 PCM; random-weight models exceed [-1, 1], so clip first."""
    return (np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def encode_audio(audio: np.ndarray, sample_rate: int, fmt: str = "wav") -> bytes:
    fmt = fmt.lower()
    audio = np.asarray(audio, dtype=np.float32)
    audio = np.clip(audio if audio.ndim == 2 else audio.reshape(-1), -1.0, 1.0)
    if fmt == "pcm":
        return to_pcm16(audio)
    if fmt == "opus":
        return _encode_opus(audio, sample_rate)
    if fmt == "aac":
        return _encode_with_av(audio, sample_rate, "adts", "aac")
    if fmt not in _SF_FORMATS:
        raise ValueError(f"response_format: unsupported audio format {fmt!r}; use one of {list(AUDIO_FORMATS)}")
    container, subtype = _SF_FORMATS[fmt]
    buf = io.BytesIO()
    sf.write(buf, audio, sample_rate, format=container, subtype=subtype)
    return buf.getvalue()


def _encode_opus(audio: np.ndarray, sample_rate: int) -> bytes:
    """Ogg/Opus through PyAV (libopus runs at 48 kHz, so resample first, channel by channel)."""
    if audio.ndim == 2:
        resampled = np.stack([resample(channel, sample_rate, 48000) for channel in audio.T], axis=1)
    else:
        resampled = resample(audio, sample_rate, 48000)
    return _encode_with_av(resampled, 48000, "ogg", "libopus")


def _encode_with_av(audio: np.ndarray, sample_rate: int, container_format: str, codec: str) -> bytes:
    """One mono or stereo waveform through a PyAV encoder and muxer (AAC in ADTS, Opus in Ogg)."""
    import av

    layout = "stereo" if audio.ndim == 2 and audio.shape[1] == 2 else "mono"
    if audio.ndim == 2 and layout == "mono":
        audio = audio.mean(axis=1)  # more channels than stereo: these encoders get a downmix
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=sample_rate, layout=layout)
        # Packed float samples: one plane, channels interleaved.
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio).reshape(1, -1), format="flt", layout=layout)
        frame.sample_rate = sample_rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


class AudioTooLongError(ValueError):
    """An input audio file lasts longer than allowed (read from its header, before decoding)."""


def decode_audio(data: bytes, target_rate: int | None = None, field: str = "audio",
                 max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Decode any soundfile-readable bytes to float32 mono, optionally resampled. A file
    whose header declares more than `max_seconds` is refused before it is decoded (a few
    KB of FLAC can hold hours of silence)."""
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate, frames = f.samplerate, f.frames
            too_long = max_seconds is not None and frames > max_seconds * rate
            audio = None if too_long else f.read(dtype="float32", always_2d=True)
    except Exception as e:  # soundfile raises LibsndfileError/RuntimeError for bad input
        raise ValueError(f"{field}: not a decodable audio file ({e})") from None
    if audio is None:
        raise AudioTooLongError(f"{field}: {frames / rate:.1f} s of audio, over the server's limit of "
                                f"{max_seconds:g} s")
    if audio.size == 0:
        raise ValueError(f"{field}: the audio is empty")
    mono = audio.mean(axis=1)
    if target_rate is not None and target_rate != rate:
        return resample(mono, rate, target_rate), target_rate
    return mono, rate


def resample(audio: np.ndarray, orig_rate: int, new_rate: int) -> np.ndarray:
    """Band-limited resampling by FFT (numpy only); exact length round(n * new / orig)."""
    audio = np.asarray(audio, dtype=np.float32)
    if orig_rate == new_rate or audio.size == 0:
        return audio
    n_out = int(round(audio.size * new_rate / orig_rate))
    spectrum = np.fft.rfft(audio)
    n_bins = n_out // 2 + 1
    if n_bins <= spectrum.size:
        spectrum = spectrum[:n_bins]
    else:
        spectrum = np.concatenate([spectrum, np.zeros(n_bins - spectrum.size, dtype=spectrum.dtype)])
    return (np.fft.irfft(spectrum, n=n_out) * (n_out / audio.size)).astype(np.float32)


def change_speed(audio: np.ndarray, speed: float) -> np.ndarray:
    """Play `speed` times faster by resampling (pitch shifts with it)."""
    if speed == 1.0:
        return audio
    return resample(audio, int(round(speed * 10000)), 10000)


def wav_stream_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """A WAV header with the data size set to the maximum: the length is not known yet."""
    byte_rate = sample_rate * channels * bits // 8
    unknown = 0xFFFFFFFF
    return (b"RIFF" + struct.pack("<I", unknown) + b"WAVE" + b"fmt "
            + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, byte_rate, channels * bits // 8, bits)
            + b"data" + struct.pack("<I", unknown))


class StreamingAudioEncoder:
    """Bytes for each chunk as it arrives: raw PCM16, or WAV (header first, then PCM16)."""

    def __init__(self, sample_rate: int, fmt: str = "pcm"):
        if fmt not in ("pcm", "wav"):
            raise ValueError(f"response_format: streaming supports 'pcm' and 'wav', not {fmt!r}")
        self.sample_rate = sample_rate
        self.fmt = fmt
        self._started = False

    def encode(self, chunk: np.ndarray) -> bytes:
        out = b""
        if not self._started and self.fmt == "wav":
            out = wav_stream_header(self.sample_rate)
        self._started = True
        return out + to_pcm16(chunk)
