import io

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from omnistage.media.audio import (StreamingAudioEncoder, change_speed, decode_audio, encode_audio, resample,
                                   wav_stream_header)
from omnistage.media.image import decode_base64_payload, decode_image, encode_image, image_to_data_url
from omnistage.media.video import decode_audio_track, decode_video, encode_mp4


def _sine(rate=24000, seconds=0.5, freq=440.0):
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp"])
def test_image_round_trip(fmt):
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (16, 24, 3), dtype=np.uint8))
    back = decode_image(encode_image(img, fmt))
    assert back.size == (24, 16) and back.mode == "RGB"
    if fmt == "png":
        assert np.array_equal(np.asarray(back), np.asarray(img))


def test_image_errors_name_the_field():
    with pytest.raises(ValueError, match="^mask: not a decodable image"):
        decode_image(b"not an image", field="mask")
    with pytest.raises(ValueError, match="output_format"):
        encode_image(Image.new("RGB", (4, 4)), "bmp")
    with pytest.raises(ValueError, match="image_url: invalid base64"):
        decode_base64_payload("data:image/png;base64,@@@", "image_url")


def test_data_url_round_trip():
    img = Image.new("RGB", (8, 8), (10, 20, 30))
    data = decode_base64_payload(image_to_data_url(img), "x")
    assert np.asarray(decode_image(data))[0, 0].tolist() == [10, 20, 30]


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3"])
def test_audio_encode_decode(fmt):
    wav = _sine()
    audio, rate = decode_audio(encode_audio(wav, 24000, fmt))
    assert rate == 24000
    # mp3 adds encoder delay/padding; lossless formats keep the length.
    if fmt == "mp3":
        assert abs(audio.size - wav.size) < 3000
    else:
        assert audio.size == wav.size
        assert np.max(np.abs(audio - wav)) < 1e-3


def test_opus_via_pyav():
    data = encode_audio(_sine(), 24000, "opus")
    assert data[:4] == b"OggS"


def test_pcm_is_clipped_int16():
    pcm = encode_audio(np.array([2.0, -2.0, 0.0], dtype=np.float32), 24000, "pcm")
    assert np.frombuffer(pcm, "<i2").tolist() == [32767, -32767, 0]


def test_decode_mixes_to_mono_and_resamples():
    stereo = np.stack([_sine(16000), _sine(16000)], axis=1)
    buf = io.BytesIO()
    sf.write(buf, stereo, 16000, format="WAV")
    audio, rate = decode_audio(buf.getvalue(), target_rate=24000)
    assert rate == 24000 and audio.ndim == 1 and audio.size == 12000
    with pytest.raises(ValueError, match="audio_sample: not a decodable audio"):
        decode_audio(b"garbage", field="audio_sample")


def test_resample_keeps_a_tone():
    out = resample(_sine(24000, 1.0, 440.0), 24000, 16000)
    spectrum = np.abs(np.fft.rfft(out))
    assert out.size == 16000 and abs(np.argmax(spectrum) - 440) <= 1


def test_speed_changes_length():
    assert change_speed(_sine(), 2.0).size == _sine().size // 2


def test_streaming_wav_header_then_pcm():
    enc = StreamingAudioEncoder(24000, "wav")
    first, second = enc.encode(_sine()[:100]), enc.encode(_sine()[100:200])
    assert first.startswith(b"RIFF") and len(first) == 44 + 200 and len(second) == 200
    assert wav_stream_header(24000)[22:28] == b"\x01\x00\xc0\x5d\x00\x00"  # mono, 24000 Hz


def test_mp4_round_trip():
    frames = np.random.default_rng(0).integers(0, 255, (9, 33, 31, 3), dtype=np.uint8)
    data = encode_mp4(frames, fps=8)
    decoded, fps = decode_video(data)
    assert decoded.shape == (9, 34, 32, 3) and fps == 8
    with pytest.raises(ValueError, match="uint8"):
        encode_mp4(frames.astype(np.float32), fps=8)
    assert decode_audio_track(data) is None  # no soundtrack given, no audio stream


def test_mp4_carries_a_soundtrack():
    # A stereo track (LTX-2's vocoder output) muxed as AAC beside the video; each channel survives.
    frames = np.zeros((8, 16, 16, 3), np.uint8)
    left, right = _sine(16000, 0.5, 440.0), 0.6 * _sine(16000, 0.5, 220.0)
    data = encode_mp4(frames, fps=16, audio=np.stack([left, right]), sample_rate=16000)
    assert decode_video(data)[0].shape == (8, 16, 16, 3)
    audio, rate = decode_audio_track(data)
    assert rate == 16000 and audio.shape[0] == 2 and audio.shape[1] >= left.size
    n = left.size - 1024  # AAC's last frame is a padded one
    assert np.corrcoef(audio[0, :n], left[:n])[0, 1] > 0.95
    assert np.corrcoef(audio[1, :n], right[:n])[0, 1] > 0.95
    with pytest.raises(ValueError, match="sample_rate"):
        encode_mp4(frames, fps=16, audio=left)
