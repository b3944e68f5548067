"""MP4 (H.264, with an optional AAC track) encoding and decoding with PyAV."""

from __future__ import annotations

import io
from fractions import Fraction
from typing import NamedTuple

import numpy as np


def encode_mp4(frames: np.ndarray, fps: float, crf: int = 18, audio: tuple[np.ndarray, int] | None = None) -> bytes:
    """frames: uint8 [num_frames, H, W, 3]. H.264 needs even sizes, so odd edges are padded.
    `audio` (float32 mono waveform, sample rate) becomes an AAC track next to the video."""
    import av

    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [F, H, W, 3], got {frames.dtype} {frames.shape}")
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf)}
        sound = container.add_stream("aac", rate=audio[1], layout="mono") if audio is not None else None
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
        if sound is not None:
            wave = np.clip(np.asarray(audio[0], dtype=np.float32).reshape(1, -1), -1.0, 1.0)
            track = av.AudioFrame.from_ndarray(wave, format="flt", layout="mono")
            track.sample_rate = audio[1]
            for packet in [*sound.encode(track), *sound.encode(None)]:
                container.mux(packet)
    return buf.getvalue()


def decode_video(data: bytes) -> tuple[np.ndarray, float]:
    """uint8 [F, H, W, 3] frames and the fps of an encoded video."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate or 0)
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    return np.stack(frames), fps


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
    """The video's first audio track as (float32 mono, sample rate), or None when it has none."""
    import av

    with av.open(io.BytesIO(data)) as container:
        if not container.streams.audio:
            return None
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=stream.rate)
        chunks = [out.to_ndarray().reshape(-1) for frame in container.decode(stream)
                  for out in resampler.resample(frame)]
        rate = stream.rate
    chunks += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]
    return (np.concatenate(chunks) if chunks else np.zeros(0, np.float32)), rate
