"""Fragmented MP4 (H.264) made piece by piece, for video streamed as it is generated.

`FragmentedMP4Encoder.encode(frames)` turns the next frames into one fragment (`moof` +
`mdat`), the first one led by the init segment (`ftyp` + `moov`). The bytes of every call,
concatenated in order, are one valid MP4 (what `/v1/realtime/video` sends, one WebSocket
binary frame per call).

Why one PyAV container per call: the mp4 muxer writes a fragment only when the next one
starts (or at the end), and PyAV has no call that flushes it earlier, so a chunk's frames
would leave a chunk late. Each call muxes its frames into its own container (a fresh GOP,
the same encoder settings, so the same SPS/PPS as the first call's `moov`) and keeps only
its fragment; the fragment's sequence number is given to the muxer (`fragment_index`), and
its decode time (`tfdt`), which a fresh container starts at 0, is set here to where the
previous fragments end.
"""

from __future__ import annotations

import io
import struct
from fractions import Fraction

import numpy as np

from omnistage.media.video import even_sized

MOVFLAGS = "empty_moov+default_base_moof+frag_keyframe+skip_trailer"


def _boxes(data: bytes, start: int = 0, end: int | None = None):
    """(type, offset, size) of the ISO-BMFF boxes in data[start:end] (32-bit sizes, as the muxer writes)."""
    end = len(data) if end is None else end
    offset = start
    while offset < end:
        size, kind = struct.unpack(">I4s", data[offset:offset + 8])
        if size < 8:
            raise ValueError(f"malformed MP4 box {kind!r} at {offset}")
        yield kind.decode("latin-1"), offset, size
        offset += size


def _find(data: bytes, path: list[str], start: int = 0, end: int | None = None) -> tuple[int, int]:
    """(offset, size) of the first box at `path` (e.g. ["moof", "traf", "tfdt"])."""
    for kind, offset, size in _boxes(data, start, end):
        if kind == path[0]:
            return (offset, size) if len(path) == 1 else _find(data, path[1:], offset + 8, offset + size)
    raise ValueError(f"no {'/'.join(path)} box")


class FragmentedMP4Encoder:
    def __init__(self, fps: float, crf: int = 18):
        self.rate = Fraction(fps).limit_denominator(1000)
        self.crf = crf
        self.num_frames = 0
        self.num_fragments = 0
        self._timescale: int | None = None  # of the video track, from the first call's moov

    def encode(self, frames: np.ndarray) -> bytes:
        """uint8 [F >= 1, H, W, 3] (the same size every call) -> the next fragment's bytes."""
        import av

        frames = even_sized(frames)
        if not len(frames):
            raise ValueError("a fragment needs at least one frame")
        buf = io.BytesIO()
        options = {"movflags": MOVFLAGS, "fragment_index": str(self.num_fragments + 1)}
        with av.open(buf, mode="w", format="mp4", options=options) as container:
            stream = container.add_stream("libx264", rate=self.rate)
            stream.width, stream.height = frames.shape[2], frames.shape[1]
            stream.pix_fmt = "yuv420p"
            # zerolatency: no B-frames or lookahead, so every fragment stands alone and decodes in order.
            stream.options = {"crf": str(self.crf), "tune": "zerolatency"}
            for frame in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode(None):
                container.mux(packet)
        data = bytearray(buf.getvalue())
        if self._timescale is None:
            mdhd, _ = _find(data, ["moov", "trak", "mdia", "mdhd"])
            version = data[mdhd + 8]
            self._timescale = struct.unpack(">I", data[mdhd + (28 if version == 1 else 20):][:4])[0]
        self._set_decode_time(data)
        keep = ("ftyp", "moov", "moof", "mdat") if self.num_fragments == 0 else ("moof", "mdat")
        out = b"".join(bytes(data[o:o + s]) for kind, o, s in _boxes(data) if kind in keep)
        self.num_frames += len(frames)
        self.num_fragments += 1
        return out

    def _set_decode_time(self, data: bytearray) -> None:
        """The fragment starts where the frames before it end (in the track's timescale)."""
        start = self.num_frames * self._timescale / self.rate
        if start.denominator != 1:
            raise ValueError(f"fps {float(self.rate)} does not divide the track timescale {self._timescale}")
        moof, size = _find(data, ["moof"])
        tfdt, _ = _find(data, ["traf", "tfdt"], moof + 8, moof + size)
        if data[tfdt + 8] == 1:
            data[tfdt + 12:tfdt + 20] = struct.pack(">Q", int(start))
        else:
            data[tfdt + 12:tfdt + 16] = struct.pack(">I", int(start))
