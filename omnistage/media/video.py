"""MP4 (H.264, with an optional AAC track) encoding and decoding with PyAV."""

from __future__ import annotations

import io
from fractions import Fraction
from typing import NamedTuple

import numpy as np


def encode_mp4(frames: np.ndarray, fps: float, crf: int = 18, audio: np.ndarray | None = None,
               sample_rate: int | None = None) -> bytes:
    """frames: uint8 [num_frames, H, W, 3]. H.264 needs even sizes, so odd edges are padded.
    `audio` (float [channels, samples] in [-1, 1], or [samples] mono) at `sample_rate` becomes
    an AAC track beside the video (a model that makes a soundtrack, e.g. LTX-2)."""
    import av

    frames = even_sized(frames)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf)}
        audio_stream = _add_audio_stream(container, audio, sample_rate) if audio is not None else None
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
        if audio_stream is not None:
            _encode_audio(container, audio_stream, audio, sample_rate)
    return buf.getvalue()


def even_sized(frames: np.ndarray) -> np.ndarray:
    """uint8 [F, H, W, 3] frames, odd edges padded: H.264 needs even sizes."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [F, H, W, 3], got {frames.dtype} {frames.shape}")
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return frames


def _planar(audio: np.ndarray) -> np.ndarray:
    """float32 [channels, samples] in [-1, 1] (mono as one channel)."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim == 1:
        audio = audio[None]
    if audio.ndim != 2 or audio.shape[0] not in (1, 2):
        raise ValueError(f"audio must be [samples] or [channels (1 or 2), samples], got {audio.shape}")
    return np.ascontiguousarray(np.clip(audio, -1.0, 1.0))


def _add_audio_stream(container, audio: np.ndarray, sample_rate: int | None):
    if not sample_rate or sample_rate <= 0:
        raise ValueError(f"audio needs a positive sample_rate, got {sample_rate}")
    stream = container.add_stream("aac", rate=int(sample_rate))
    stream.layout = "stereo" if _planar(audio).shape[0] == 2 else "mono"
    return stream


def _encode_audio(container, stream, audio: np.ndarray, sample_rate: int) -> None:
    """The waveform as one planar float frame; the encoder cuts it into AAC frames."""
    import av

    planar = _planar(audio)
    frame = av.AudioFrame.from_ndarray(planar, format="fltp", layout="stereo" if planar.shape[0] == 2 else "mono")
    frame.sample_rate = int(sample_rate)
    frame.pts = 0
    for packet in stream.encode(frame):
        container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)


def decode_video(data: bytes) -> tuple[np.ndarray, float]:
    """uint8 [F, H, W, 3] frames and the fps of an encoded video."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate or 0)
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    return np.stack(frames), fps


def decode_audio_track(data: bytes) -> tuple[np.ndarray, int] | None:
    """float32 [channels, samples] and the sample rate of an encoded video's first audio
    track; None when it has none."""
    import av

    with av.open(io.BytesIO(data)) as container:
        if not container.streams.audio:
            return None
        stream = container.streams.audio[0]
        chunks = [f.to_ndarray() for f in container.decode(stream)]  # fltp: [channels, samples] each
        return np.concatenate(chunks, axis=1).astype(np.float32), int(stream.rate)


class VideoInfo(NamedTuple):
    num_frames: int
    fps: float
    width: int
    height: int

    @property
    def seconds(self) -> float:
        return self.num_frames / self.fps if self.fps > 0 else 0.0


def probe_video(data: bytes) -> VideoInfo:
    """Frame count, fps and size of an encoded video, from its header and packets: nothing is decoded.
    Raises ValueError when the bytes are no video."""
    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.video:
                raise ValueError("the file has no video stream")
            stream = container.streams.video[0]
            count = stream.frames or sum(1 for p in container.demux(stream) if p.size)
            return VideoInfo(count, float(stream.average_rate or 0), stream.width, stream.height)
    except av.error.FFmpegError as e:
        raise ValueError(f"not a decodable video: {e}") from None


def decode_video_frames(data: bytes, indices: list[int]) -> np.ndarray:
    """uint8 [len(indices), H, W, 3]: only the frames at `indices` (ascending) are kept, so a
    long video costs its decode time but not its frames' memory."""
    import av

    wanted, frames = set(indices), {}
    with av.open(io.BytesIO(data)) as container:
        for i, frame in enumerate(container.decode(container.streams.video[0])):
            if i in wanted:
                frames[i] = frame.to_ndarray(format="rgb24")
            if i >= indices[-1]:
                break
    missing = [i for i in indices if i not in frames]
    if missing:
        raise ValueError(f"the video has no frame {missing[0]} (it decodes to fewer frames than its header says)")
    return np.stack([frames[i] for i in indices])


def decode_video_audio(data: bytes) -> tuple[np.ndarray, int] | None:
    """The video's first audio track mixed down to float32 mono, and its sample rate; None when it has none."""
    track = decode_audio_track(data)
    return None if track is None else (track[0].mean(axis=0), track[1])
