"""The Realtime API's audio formats as bytes <-> float32 waveforms.

OpenAI's three formats, under their GA names and the beta names clients still send:

    audio/pcm   (pcm16)      16-bit little-endian mono PCM at 24 kHz
    audio/pcmu  (g711_ulaw)  G.711 mu-law at 8 kHz
    audio/pcma  (g711_alaw)  G.711 A-law at 8 kHz

G.711 goes through soundfile's RAW ULAW/ALAW codecs (libsndfile), not a codec of our own.
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np
import soundfile as sf

from omnistage.entrypoints.openai.errors import bad_request
from omnistage.media.audio import resample, to_pcm16

RATES = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}
_G711 = {"audio/pcmu": "ULAW", "audio/pcma": "ALAW"}
BETA_NAMES = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}
"""The beta protocol's format names, as the GA types they mean."""


def decode(data: bytes, fmt: str) -> np.ndarray:
    """Mono float32 at `RATES[fmt]`; a trailing odd byte of PCM16 is an error, not dropped."""
    if fmt == "audio/pcm":
        if len(data) % 2:
            raise ValueError("pcm16 audio must be whole 16-bit samples (an even number of bytes)")
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    if not data:
        return np.zeros(0, dtype=np.float32)
    audio, _ = sf.read(io.BytesIO(data), samplerate=8000, channels=1, format="RAW", subtype=_G711[fmt],
                       dtype="float32")
    return audio


def decode_base64(data: str, fmt: str, param: str) -> np.ndarray:
    """An event's base64 audio field as `decode` reads it, or a 400 naming `param`."""
    try:
        return decode(base64.b64decode(data, validate=True), fmt)
    except (binascii.Error, ValueError) as e:
        raise bad_request(f"{param}: not base64 {fmt} audio ({e})", param=param) from None


def encode(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """`audio` (float32 at `sample_rate`) in `fmt`, resampled to the format's rate."""
    audio = resample(audio, sample_rate, RATES[fmt])
    if fmt == "audio/pcm":
        return to_pcm16(audio)
    out = io.BytesIO()
    sf.write(out, np.clip(audio, -1.0, 1.0), 8000, format="RAW", subtype=_G711[fmt])
    return out.getvalue()
